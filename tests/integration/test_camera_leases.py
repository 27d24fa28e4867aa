"""Split roles on one machine: ``framebatch decode`` and two ``framebatch detect`` workers
against one real redis-server.  The workers share the cameras through leases; one is killed
(SIGKILL) mid-run and the other takes its cameras over within the lease TTL and a tick, claims
their unfinished frames, and every frame ends with detections or a counted drop, in order."""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from framebatch_tools.audit import CameraAudit, audit
from pipeline.leases.camera_leases import rendezvous_owner
from streams.embedded_redis import EmbeddedRedis
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import DetectionMessage
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import (
    even_pair,
    start_daemon,
    stop_daemon,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

CLIP = SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"
FRAMES = 60
CAMERAS = ["c0", "c1", "c2", "c3"]
LEASE_TTL_S = 2.0
PREFIX = "split"
#: two worker names that rendezvous hashing gives two of the four cameras each
WORKERS = even_pair(CAMERAS, "worker")
SHARES = {camera: rendezvous_owner(camera, WORKERS) for camera in CAMERAS}


def lease_owners(client: redis.Redis, keys: StreamKeys) -> dict[str, str]:
    owners = {}
    for camera in CAMERAS:
        owner = client.get(keys.lease(camera))
        if owner is not None:
            owners[camera] = owner.decode()
    return owners


def detections(client: redis.Redis, keys: StreamKeys, camera: str) -> list[DetectionMessage]:
    return [DetectionMessage.from_fields(f) for _, f in client.xrange(keys.detections(camera))]


def wait_complete(client: redis.Redis, keys: StreamKeys) -> list[CameraAudit]:
    """Each camera's audit once every one of its frames is detected or dropped; on a timeout,
    what was missing: each camera's audit, frames group, pending entries, lease, ledger tail."""

    def check():
        reports = audit(client, keys, CAMERAS)
        return reports if all(r.ok and r.frames == FRAMES for r in reports) else None

    def describe() -> str:
        lines = []
        for report in audit(client, keys, CAMERAS):
            stream = keys.frames(report.camera)
            try:
                group = client.xinfo_groups(stream)
                pending = client.xpending_range(stream, FRAMES_GROUP, "-", "+", 20)
            except redis.ResponseError as exc:
                group, pending = str(exc), []
            held = [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending]
            ledger = [fields for _id, fields in client.xrange(keys.ledger(report.camera))]
            lines.append(
                f"{report.line()}; unaccounted {report.unaccounted[:5]}; group {group}; "
                f"pending {held}; lease {client.get(keys.lease(report.camera))}; "
                f"ledger {ledger[-6:]}"
            )
        return "\n".join(lines)

    return wait_for(check, 120, "every frame detected or dropped", 0.5, describe)


def kill_and_time_the_take_over(client: redis.Redis, keys: StreamKeys, worker, victim) -> float:
    """Once the victim's cameras are detecting, SIGKILL it; seconds until the other worker
    holds every one of its cameras."""
    survivor = next(w for w in WORKERS if w != victim)
    theirs = sorted(c for c, w in SHARES.items() if w == victim)
    wait_for(
        lambda: all(len(detections(client, keys, c)) >= 5 for c in theirs),
        60,
        "the victim's cameras detected",
    )
    worker.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(
        lambda: all(lease_owners(client, keys).get(c) == survivor for c in theirs),
        LEASE_TTL_S + 10,
        "the victim's cameras taken over",
        poll_s=0.02,
    )
    return time.monotonic() - killed_at


def assert_every_frame_detected_in_order(client: redis.Redis, keys: StreamKeys, reports) -> None:
    for report in reports:
        assert report.detected == FRAMES and not report.dropped, report.line()
    for camera in CAMERAS:
        seen: set[str] = set()
        order = []
        for message in detections(client, keys, camera):
            if message.frame_id not in seen:
                seen.add(message.frame_id)
                order.append(message.seq)
        assert order == sorted(order), camera  # per-camera order kept across the take-over


def test_a_killed_workers_cameras_move_to_the_other_and_nothing_is_lost(assets, tmp_path):
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        kill_a_worker_mid_run(tmp_path, client, {"url": server.url})


def kill_a_worker_mid_run(tmp_path, client: redis.Redis, redis_config: dict) -> None:
    """``framebatch decode`` and two ``framebatch detect`` workers on four cameras against the
    Redis of ``redis_config`` (read through ``client``); one worker SIGKILLed mid-run.  Its
    cameras must move within the TTL and a tick, and every frame be detected, in order."""
    keys = StreamKeys(PREFIX)
    config = write_config(
        tmp_path / "split.yaml",
        model=MODEL,
        cameras=[
            # file jobs wait for room in their 4-frame streams: paced by the workers, so
            # the victim's cameras wait for the take-over and nothing may be dropped
            {"id": camera, "url": str(CLIP), "realtime": False}
            for camera in CAMERAS
        ],
        redis_url=redis_config["url"],
        prefix=PREFIX,
        redis={**redis_config, "prefix": PREFIX, "lease_ttl_s": LEASE_TTL_S, "frames_maxlen": 4},
        max_batch_size=4,
    )
    workers = {
        worker: start_daemon(
            config,
            *("--http", "off", "--worker-id", worker),
            *("--summary-json", str(tmp_path / f"{worker}.json")),
            command="detect",
        )
        for worker in WORKERS
    }
    decoders = None
    try:
        # the first worker up takes every camera, then hands the other its share
        wait_for(lambda: client.zcard(keys.workers()) == 2, 90, "two workers registered")
        wait_for(lambda: lease_owners(client, keys) == SHARES, 30, "the cameras shared")
        decoders = start_daemon(config, command="decode")
        victim, survivor = WORKERS
        moved_after = kill_and_time_the_take_over(client, keys, workers[victim], victim)
        workers[victim].wait()
        decoders.wait(120)  # every file decoded
        assert decoders.returncode == 0, decoders.stderr.read()
        reports = wait_complete(client, keys)
        code, _out, err = stop_daemon(workers[survivor])
        assert code == 0, err
    finally:
        for process in [*workers.values(), decoders]:
            if process is not None and process.poll() is None:
                stop_daemon(process)
    # within the TTL and the survivor's next tick (a third of the TTL, at most 1 s)
    assert moved_after <= LEASE_TTL_S + 1.0, moved_after
    assert_every_frame_detected_in_order(client, keys, reports)
    summary = json.loads((tmp_path / f"{survivor}.json").read_text())
    took = {c["camera"]: c for c in summary["cameras"]}
    for camera in (c for c, w in SHARES.items() if w == victim):
        assert took[camera]["handed_over"] > 0  # the victim received some before it died
