"""framebatch on a real Redis Cluster (three masters on loopback): each camera's keys share a
slot, the cameras spread over the nodes, and no command framebatch sends spans slots (a cluster
node refuses one with CROSSSLOT, so a run that completes proves it).  The split roles run with
a worker killed mid-run, which also exercises the lease scripts, XCLAIM and the fenced position
on the cluster; ``framebatch consume --cluster`` reads every camera back."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.cluster import key_slot

from framebatch_tools.local_cluster import LocalRedisCluster
from pipeline.fleet.registry import registry_probes
from pipeline.leases.camera_leases import lease_probes
from streams.fence import DecodeLease, claim_session, end_sessions_in_progress
from streams.keys import StreamKeys
from streams.redis_access import check_access
from streams.redis_cluster import GroupsMissing, SlotTransactions, read_streams
from streams.redis_connect import connect
from streams.redis_errors import is_nogroup, is_outage
from tests.acl_rules import DAEMON_RULES, DETECT_RULES, REGISTRY_RULES
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import framebatch, wait_for, write_config
from tests.integration.test_camera_leases import (
    CAMERAS,
    CLIP,
    FRAMES,
    PREFIX,
    kill_a_worker_mid_run,
)

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


def test_a_lost_decode_workers_sessions_are_ended_together_across_the_nodes(cluster):
    """The take-over's batched end (one pipeline of EVALs, a round trip per node) on cameras
    whose keys live on every node."""
    keys = StreamKeys(f"{PREFIX}-end")
    lost, taker = DecodeLease("lost", 5000), DecodeLease("taker", 5000)
    client = connect(cluster.url, cluster=True)
    try:
        for camera in CAMERAS:
            client.set(keys.decode_lease(camera), "lost")
            assert claim_session(client, keys, camera, lost, f"s-{camera}", final=False)
            client.set(keys.decode_lease(camera), "taker")
        ended = end_sessions_in_progress(
            client, keys, CAMERAS, taker, lambda c: f"{c}: lost", final=lambda c: False
        )
        assert sorted(ended) == sorted(CAMERAS)
        for camera in CAMERAS:
            ((_id, fields),) = client.xrange(keys.frames(camera))
            assert fields[b"session"] == f"s-{camera}".encode() and fields[b"reason"] == b"crashed"
            assert not client.exists(keys.progress(camera))
    finally:
        client.close()


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
    rules = [*DAEMON_RULES, *DETECT_RULES, *REGISTRY_RULES]
    rules += CLUSTER_RULES if documented else []
    for port in cluster.ports:  # ACL users are per node
        with redis.Redis(port=port) as node:
            node.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~fb:*", *rules)
    url = cluster.url.replace("redis://", f"redis://{user}:{password}@")
    if documented:
        with connect(url, cluster=True) as client:
            probes = [lease_probes, registry_probes]
            check_access(client, StreamKeys("fb"), url=url, more=lambda c, k: [
                probe for more in probes for probe in more(c, k)
            ])  # fmt: skip
    else:
        with pytest.raises(redis.exceptions.NoPermissionError, match="cluster"):
            connect(url, cluster=True)


def test_a_client_rides_out_a_node_restart_and_keeps_what_other_nodes_read():
    """A master down for 3 s (its slots, then the whole cluster, refuse commands): commands,
    pipelines and transactions wait it out, as on a single Redis; a fail-fast client says
    "outage" at once; the node comes back empty, and a read over streams of two nodes keeps
    the entries of the one that kept its group."""
    keys = StreamKeys("fb")
    with LocalRedisCluster() as nodes, ThreadPoolExecutor(3) as pool:
        on = {nodes.node_of(keys.frames(c)): c for c in CAMERAS}
        kept, lost = on[0], on[1]
        client = connect(nodes.url, cluster=True, reconnect_timeout_s=30)
        fail_fast = connect(nodes.url, cluster=True, fail_fast=True)
        for camera in (kept, lost):
            client.xgroup_create(keys.frames(camera), "g", id="0", mkstream=True)
            client.xadd(keys.frames(camera), {"n": 1})
        nodes.stop_node(1)
        with pytest.raises(redis.ConnectionError) as refused:
            fail_fast.xlen(keys.frames(lost))
        assert is_outage(refused.value)
        started = time.monotonic()

        def write(atomic: bool) -> list:
            tx = SlotTransactions(client, atomic=atomic)
            for camera in (kept, lost):
                tx.on(keys.ledger(camera)).xadd(keys.ledger(camera), {"n": 1})
            return tx.execute()

        waiting = [
            pool.submit(client.xlen, keys.frames(lost)),
            pool.submit(write, True),
            pool.submit(write, False),
        ]
        time.sleep(3)
        nodes.start_node(1)  # from this thread: a node dies with the thread that started it
        assert waiting[0].result(30) == 0  # back, without its data
        assert all(len(w.result(30)) == 2 for w in waiting[1:])
        assert time.monotonic() - started >= 3
        with pytest.raises(GroupsMissing) as missing:
            read_streams(
                client, {keys.frames(kept): ">", keys.frames(lost): ">"}, group="g", consumer="w"
            )
        assert missing.value.keys == [keys.frames(lost)] and is_nogroup(missing.value)
        ((key, entries),) = missing.value.reply
        assert key.decode() == keys.frames(kept) and len(entries) == 1
        client.close()
        fail_fast.close()


def test_the_daemon_rides_out_a_node_restart(tmp_path, assets):
    """``framebatch run`` on four cameras over three masters; one master is restarted without
    its data mid-run.  The run ends normally; the cameras on the other nodes lose nothing;
    those on the restarted one count what it lost as redis_lost; every frame is processed or
    counted."""
    prefix = "restart"
    keys = StreamKeys(prefix)
    with LocalRedisCluster() as nodes:
        config = write_config(
            tmp_path / "restart.yaml",
            model=MODEL,
            cameras=[
                # paced (12 s a clip): frames still come after the restart, and show the gap
                # (a file whose decoder finished before it would wait for its lost end entry:
                # docs/reliability.md, "Redis restarted empty")
                {"id": c, "url": str(CLIP), "realtime": True, "fps": 5}
                for c in CAMERAS
            ],
            redis_url=nodes.url,
            prefix=prefix,
            redis={"url": nodes.url, "prefix": prefix, "cluster": True, "reconnect_timeout_s": 30},
        )
        summary = tmp_path / "summary.json"
        result: dict = {}
        run = threading.Thread(
            target=lambda: result.update(
                proc=framebatch("run", str(config), "--until-done", "--summary-json", str(summary))
            )
        )
        run.start()
        with connect(nodes.url, cluster=True) as client:
            wait_for(
                lambda: all(client.xlen(keys.detections(c)) >= 1 for c in CAMERAS),
                120,
                "detections of every camera",
            )
        nodes.stop_node(1)
        time.sleep(3)
        nodes.start_node(1)
        run.join(240)
    proc = result["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "Redis Cluster unreachable" in proc.stderr  # the outage was met, and ridden out
    cameras = {c["camera"]: c for c in json.loads(summary.read_text())["cameras"]}
    restarted = {c for c in CAMERAS if nodes.node_of(keys.frames(c)) == 1}
    for camera, figures in cameras.items():
        dropped = figures["dropped"]
        assert figures["decoded"] == FRAMES and figures["in_flight"] == 0, figures
        assert figures["processed"] + sum(dropped.values()) == FRAMES, figures
        if camera in restarted:
            assert set(dropped) <= {"redis_lost"}, figures
        else:
            assert dropped == {}, figures  # its node kept everything
