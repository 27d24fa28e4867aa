"""deploy/kubernetes/, checked offline: every built-in resource validates against Kubernetes'
own OpenAPI schemas (kubernetes-validate, strict: no unknown field), the custom resources
(ServiceMonitor, KEDA ScaledObject) have what their operators read, and the pieces refer to
each other correctly: the config the pods mount passes check-config, the Service selects the
detector pods and names their port, KEDA watches each configured camera's frames stream.

No cluster runs here: nothing is applied or started."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.config import parse_config
from streams.keys import FRAMES_GROUP, StreamKeys
from tests.conftest import REPO_ROOT
from tests.integration.runner import framebatch
from tests.integration.test_deploy_files import CONFIG_ENV, run, tool_next_to_python

pytestmark = pytest.mark.integration

KUBERNETES = REPO_ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
CUSTOM_KINDS = {"ServiceMonitor", "ScaledObject"}


@pytest.fixture(scope="module")
def resources() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in MANIFESTS:
        for document in yaml.safe_load_all(path.read_text()):
            found[(document["kind"], document["metadata"]["name"])] = document
    return found


def container(resources, deployment: str) -> dict[str, Any]:
    (only,) = resources[("Deployment", deployment)]["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_built_in_resources_validate_against_the_kubernetes_schemas(manifest: Path):
    tool = tool_next_to_python("kubernetes-validate")
    if tool is None:
        pytest.skip("kubernetes-validate is not installed (the test extra installs it)")
    proc = run(tool, "--strict", "--quiet", str(manifest))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(manifest.read_text())}
    if kinds <= CUSTOM_KINDS:  # no schema offline: only the checks below read these
        assert "Couldn't find schema" in proc.stdout + proc.stderr


def test_the_mounted_config_passes_check_config(tmp_path, resources):
    text = resources[("ConfigMap", "framebatch-config")]["data"]["config.yaml"]
    config = tmp_path / "config.yaml"
    config.write_text(text)
    proc = framebatch(  # --no-files: its paths are the pod's
        "check-config", str(config), "--no-files", timeout=60, env={**os.environ, **CONFIG_ENV}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_secret_names_every_variable_the_config_needs(resources):
    secret = resources[("Secret", "framebatch-secrets")]["stringData"]
    assert set(secret) == set(CONFIG_ENV)
    for deployment in ("framebatch-decoder", "framebatch-detector"):
        refs = container(resources, deployment)["envFrom"]
        assert {"secretRef": {"name": "framebatch-secrets"}} in refs


def test_roles_sharded_decoders_and_detectors_that_each_take_a_gpu(resources):
    decoder = resources[("Deployment", "framebatch-decoder")]
    assert decoder["spec"]["replicas"] > 1  # decode workers share the cameras by lease
    scaler = resources[("HorizontalPodAutoscaler", "framebatch-decoder")]["spec"]
    assert scaler["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "framebatch-decoder",
    }
    assert scaler["metrics"][0]["resource"]["name"] == "cpu"
    for role, command in (("decoder", "decode"), ("detector", "detect")):
        pod = container(resources, f"framebatch-{role}")
        args = pod["args"]  # each pod's worker id is its name, unique among the workers
        assert args[0] == command and args[args.index("--worker-id") + 1] == "$(POD_NAME)"
        env = {e["name"]: e for e in pod["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container(resources, "framebatch-detector")["resources"]["limits"]["nvidia.com/gpu"] == 1
    for deployment in ("framebatch-decoder", "framebatch-detector"):
        mounts = {m["mountPath"] for m in container(resources, deployment)["volumeMounts"]}
        assert "/etc/framebatch" in mounts
        assert container(resources, deployment)["args"][1] == "/etc/framebatch/config.yaml"


def test_the_service_and_servicemonitor_reach_the_detectors_metrics(resources):
    pod_labels = resources[("Deployment", "framebatch-detector")]["spec"]["template"]["metadata"][
        "labels"
    ]
    service = resources[("Service", "framebatch-detector")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"] for p in container(resources, "framebatch-detector")["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    monitor = resources[("ServiceMonitor", "framebatch-detector")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_keda_scales_the_detectors_on_each_cameras_frames_group(resources):
    scaled = resources[("ScaledObject", "framebatch-detector")]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == "framebatch-detector"
    config = parse_config(
        yaml.safe_load(resources[("ConfigMap", "framebatch-config")]["data"]["config.yaml"]),
        base_dir=".",
        environ=CONFIG_ENV,
    )
    keys = StreamKeys(config.redis.prefix)
    redis_service = resources[("Service", "framebatch-redis")]
    address = f"{redis_service['metadata']['name']}:{redis_service['spec']['ports'][0]['port']}"
    assert config.redis.url == f"redis://{address}/0"
    streams = set()
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "redis-streams"
        metadata = trigger["metadata"]
        assert metadata["address"] == address
        assert metadata["consumerGroup"] == FRAMES_GROUP
        assert int(metadata["lagCount"]) >= 1  # strings, as KEDA's metadata are
        streams.add(metadata["stream"])
    assert streams == {keys.frames(camera.id) for camera in config.cameras}
