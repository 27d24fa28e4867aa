"""framebatch on a real Redis Cluster (three masters on loopback): each camera's keys share a
slot, the cameras spread over the nodes, and no command framebatch sends spans slots (a cluster
node refuses one with CROSSSLOT, so a run that completes proves it).  The split roles run with
a worker killed mid-run, which also exercises the lease scripts, XCLAIM and the fenced position
on the cluster; ``framebatch consume --cluster`` reads every camera back."""

from __future__ import annotations

import json

import pytest
import redis
from redis.cluster import key_slot

from pipeline.leases import lease_probes
from pipeline.tools.local_cluster import LocalRedisCluster
from streams.keys import StreamKeys
from streams.redis_access import check_access
from streams.redis_connect import connect
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import framebatch, write_config
from tests.integration.test_bad_input import DAEMON_RULES, DETECT_RULES
from tests.integration.test_camera_leases import CAMERAS, FRAMES, PREFIX, kill_a_worker_mid_run

pytestmark = pytest.mark.integration

#: docs/operations.md: what a user needs on a cluster besides its role's rules
CLUSTER_RULES = ["+cluster|slots", "+command"]


@pytest.fixture(scope="module")
def cluster():
    with LocalRedisCluster() as nodes:
        yield nodes


def test_the_cameras_of_the_test_spread_over_every_node(cluster):
    keys = StreamKeys(PREFIX)
    assert {cluster.node_of(keys.frames(c)) for c in CAMERAS} == {0, 1, 2}
    for camera in CAMERAS:
        per_camera = [keys.frames, keys.detections, keys.ledger, keys.progress, keys.lease]
        slots = {key_slot(make(camera).encode()) for make in [*per_camera, keys.cursor]}
        assert len(slots) == 1


def test_split_roles_on_a_cluster_lose_nothing_when_a_worker_dies(cluster, tmp_path):
    refused = cluster.refusals()
    client = connect(cluster.url, cluster=True)
    try:
        kill_a_worker_mid_run(tmp_path, client, {"url": cluster.url, "cluster": True})
    finally:
        client.close()
    # every camera's detections, found by SCAN on each node, read back by the consumer
    proc = framebatch(
        *("consume", "--cluster", "--redis", cluster.url, "--prefix", PREFIX),
        *("--from-start", "--timeout", "3"),
    )
    assert proc.returncode == 0, proc.stderr
    frames = {(m["camera"], m["frame_id"]) for m in map(json.loads, proc.stdout.splitlines())}
    assert len(frames) == len(CAMERAS) * FRAMES
    # no command was refused by a node, not even one whose error a retry or a handler hid
    assert cluster.refusals() == refused


def test_the_daemon_runs_on_a_cluster(cluster, tmp_path, assets):
    """``framebatch run`` (decoders and batcher in one process) against the cluster."""
    prefix = "run"
    config = write_config(
        tmp_path / "run.yaml",
        model=MODEL,
        cameras=[
            {"id": c, "url": str(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"), "realtime": False}
            for c in CAMERAS
        ],
        redis_url=cluster.url,
        prefix=prefix,
        redis={"url": cluster.url, "prefix": prefix, "cluster": True},
    )
    summary = tmp_path / "summary.json"
    refused = cluster.refusals()
    proc = framebatch("run", str(config), "--until-done", "--summary-json", str(summary))
    assert proc.returncode == 0, proc.stderr[-3000:]
    cameras = {c["camera"]: c for c in json.loads(summary.read_text())["cameras"]}
    assert {c: cameras[c]["processed"] for c in CAMERAS} == {c: FRAMES for c in CAMERAS}
    assert cluster.refusals() == refused


def test_a_cluster_named_as_a_single_redis_is_one_line(cluster, tmp_path, assets):
    config = write_config(
        tmp_path / "plain.yaml",
        model=MODEL,
        cameras=[{"id": "c0", "url": str(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4")}],
        redis_url=cluster.url,
        prefix="plain",
    )
    refused = cluster.refusals()
    proc = framebatch("run", str(config), "--until-done")
    assert proc.returncode == 2, proc.stderr
    assert "redis.cluster: true" in proc.stderr and "Traceback" not in proc.stderr
    assert sum(cluster.refusals().values()) > sum(refused.values())  # it was the cluster


def test_a_single_redis_named_as_a_cluster_is_one_line(redis_url, tmp_path, assets):
    config = write_config(
        tmp_path / "single.yaml",
        model=MODEL,
        cameras=[{"id": "c0", "url": str(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4")}],
        redis_url=redis_url,
        prefix="single",
        redis={"url": redis_url, "prefix": "single", "cluster": True},
    )
    proc = framebatch("run", str(config), "--until-done")
    assert proc.returncode == 2, proc.stderr
    assert "cluster mode is not enabled" in proc.stderr and "Traceback" not in proc.stderr
    proc = framebatch("consume", "--cluster", "--redis", redis_url, "--timeout", "0.5")
    assert proc.returncode == 2, proc.stderr
    assert "cluster mode is not enabled" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("documented", [True, False], ids=["cluster-rules", "without-them"])
def test_a_cluster_user_needs_the_documented_rules(cluster, documented):
    """docs/operations.md: on a cluster the client also reads the slot map and the command
    table (CLUSTER SLOTS, COMMAND); a user without them is told which one is missing."""
    user, password = f"fb-{documented}", "pw"
    rules = [*DAEMON_RULES, *DETECT_RULES.split(), *(CLUSTER_RULES if documented else [])]
    for port in cluster.ports:  # ACL users are per node
        with redis.Redis(port=port) as node:
            node.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~fb:*", *rules)
    url = cluster.url.replace("redis://", f"redis://{user}:{password}@")
    if documented:
        with connect(url, cluster=True) as client:
            check_access(client, StreamKeys("fb"), url=url, more=lease_probes)
    else:
        with pytest.raises(redis.exceptions.NoPermissionError, match="cluster"):
            connect(url, cluster=True)
