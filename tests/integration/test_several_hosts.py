"""The split roles on several hosts (network namespaces: each host its own network stack, one
cable to a switch): Redis on one, ``framebatch decode`` on another, a ``framebatch detect``
worker on each of two more.  One worker is SIGKILLed mid-run: its cameras resume on the other
within the lease bound, and every frame is detected once it is all over, none dropped, each
camera's order kept.  The decoders' host loses its cable for 5 s: its decoders wait it out
and carry on, nothing lost.

The test process watches Redis through a unix socket (the same files, another network)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from framebatch_tools.audit import audit
from framebatch_tools.netns import Hosts, netns_available
from pipeline.leases.camera_leases import rendezvous_owner
from streams.groups import all_read
from streams.keys import StreamKeys
from tests.conftest import MODEL
from tests.integration.runner import even_pair, wait_for, write_config
from tests.integration.test_camera_leases import (
    CAMERAS,
    CLIP,
    LEASE_TTL_S,
    SHARES,
    WORKERS,
    assert_every_frame_detected_in_order,
    detections,
    kill_and_time_the_take_over,
    lease_owners,
    wait_complete,
)

pytestmark = pytest.mark.integration

PASSWORD = "netns-test-password"
PREFIX = "hosts"
#: two decode workers on hosts of their own, half the cameras each
DECODE_WORKERS = even_pair(CAMERAS, "decode")
DECODE_SHARES = {camera: rendezvous_owner(camera, DECODE_WORKERS) for camera in CAMERAS}
#: looped clips paced at 5 frames/s stand for live cameras (handed over, reopened elsewhere)
LIVE = {"url": str(CLIP), "loop": True, "realtime": True, "fps": 5}


@pytest.fixture(scope="module")
def hosts():
    available, why = netns_available()
    if not available:
        pytest.skip(why)
    with Hosts(["redis", "decoders", *WORKERS, *DECODE_WORKERS]) as built:
        yield built


def start(hosts: Hosts, host: str, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        hosts.command(host, [sys.executable, "-m", "pipeline.cli", *argv]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(process: subprocess.Popen[str] | None) -> tuple[int | None, str]:
    if process is None:
        return None, ""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        _out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        _out, err = process.communicate()
    return process.returncode, err


@contextmanager
def deployment(hosts: Hosts, tmp_path: Path, live: bool = False) -> Iterator[Deployment]:
    """Redis on its host, a detector worker on each worker host sharing the cameras (the
    decoders are the test's to start); the cameras are file jobs, or ``live``."""
    socket_path = tmp_path / "redis.sock"
    server = subprocess.Popen(
        hosts.command(
            "redis",
            [
                *("redis-server", "--bind", hosts.addresses["redis"], "--port", "6379"),
                *("--requirepass", PASSWORD, "--save", "", "--appendonly", "no"),
                *("--unixsocket", str(socket_path), "--unixsocketperm", "700"),
            ],
        ),
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://:{PASSWORD}@{hosts.addresses['redis']}:6379/0"
    processes: dict[str, subprocess.Popen[str] | None] = {}
    try:
        wait_for(socket_path.exists, 10, "redis-server listening")
        client = redis.Redis(unix_socket_path=str(socket_path), password=PASSWORD)
        keys = StreamKeys(PREFIX)
        config = write_config(
            tmp_path / "hosts.yaml",
            model=MODEL,
            cameras=[
                {"id": camera, **LIVE}
                if live
                else {"id": camera, "url": str(CLIP), "realtime": False}
                for camera in CAMERAS
            ],
            redis_url=url,
            redis={"url": url, "prefix": PREFIX, "lease_ttl_s": LEASE_TTL_S, "frames_maxlen": 4},
            transport={"kind": "raw"},  # other hosts: no shared memory between them
            max_batch_size=4,
        )
        for worker in WORKERS:
            processes[worker] = start(
                hosts, worker, "detect", str(config), "--http", "off", "--worker-id", worker
            )
        wait_for(lambda: client.zcard(keys.workers()) == 2, 90, "two workers registered")
        wait_for(lambda: lease_owners(client, keys) == SHARES, 30, "the cameras shared")
        yield Deployment(client, keys, config, processes)
    finally:
        for process in processes.values():
            stop(process)
        server.terminate()
        server.wait(10)


@dataclass
class Deployment:
    client: redis.Redis
    keys: StreamKeys
    config: Path
    processes: dict[str, subprocess.Popen[str] | None]


def test_a_worker_killed_and_a_cable_pulled_on_other_hosts_lose_nothing(assets, hosts, tmp_path):
    with deployment(hosts, tmp_path) as run:
        client, keys, processes = run.client, run.keys, run.processes
        processes["decoders"] = start(hosts, "decoders", "decode", str(run.config))
        victim, survivor = WORKERS
        moved_after = kill_and_time_the_take_over(client, keys, processes[victim], victim)
        assert processes["decoders"].poll() is None  # still decoding: the cut matters
        hosts.link("decoders", up=False)  # the decoders' host is cut off for 5 s
        time.sleep(5.0)
        hosts.link("decoders", up=True)
        code, err = stop_when_done(processes["decoders"], 180)
        assert code == 0, err
        reports = wait_complete(client, keys)
        code, err = stop(processes[survivor])
        assert code == 0, err
        assert moved_after <= LEASE_TTL_S + 1.0, moved_after
        assert_every_frame_detected_in_order(client, keys, reports)
        assert all(r.ok for r in audit(client, keys, CAMERAS))


def test_a_worker_cut_off_for_5_s_rejoins_and_nothing_is_lost(assets, hosts, tmp_path):
    """Past its TTL the cut-off worker's cameras go to the other; back, it finds its leases
    taken, stops reading them at once (it read nothing once its leases might have run out),
    rejoins, and gets its share handed back."""
    with deployment(hosts, tmp_path) as run:
        client, keys, processes = run.client, run.keys, run.processes
        processes["decoders"] = start(hosts, "decoders", "decode", str(run.config))
        cut, other = WORKERS
        theirs = sorted(c for c, w in SHARES.items() if w == cut)
        wait_for(
            lambda: all(len(detections(client, keys, c)) >= 5 for c in theirs),
            60,
            "the cut worker's cameras detected",
        )
        hosts.link(cut, up=False)
        wait_for(
            lambda: all(lease_owners(client, keys).get(c) == other for c in theirs),
            LEASE_TTL_S + 10,
            "the cut worker's cameras taken over",
        )
        time.sleep(max(0.0, 5.0 - LEASE_TTL_S))
        hosts.link(cut, up=True)
        wait_for(lambda: lease_owners(client, keys) == SHARES, 60, "the cut worker's share back")
        code, err = stop_when_done(processes["decoders"], 180)
        assert code == 0, err
        reports = wait_complete(client, keys)
        for worker in WORKERS:
            code, err = stop(processes[worker])
            assert code == 0, err
        assert_every_frame_detected_in_order(client, keys, reports)
        assert all(r.ok for r in audit(client, keys, CAMERAS))


def stop_when_done(process: subprocess.Popen[str] | None, timeout_s: float) -> tuple[int, str]:
    """A decode process exits by itself once its files are decoded."""
    assert process is not None
    try:
        _out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        _out, err = process.communicate()
        return -1, f"still running after {timeout_s:.0f} s\n{err}"
    return process.returncode, err


def decode_owners(client: redis.Redis, keys: StreamKeys) -> dict[str, str]:
    return {c: (client.get(keys.decode_lease(c)) or b"").decode() for c in CAMERAS}


def test_a_decode_host_cut_off_for_5_s_is_fenced_out_and_takes_its_share_back(
    assets, hosts, tmp_path
):
    """Two decode workers on hosts of their own.  Past its TTL the cut-off one's cameras reopen
    on the other, which ends their sessions from the progress they kept; back, the cut-off one
    writes nothing more for those sessions (fenced), then gets its share handed back, a new
    session each.  Every frame of every session is detected or dropped with a cause, and no
    frame follows its session's end."""
    with deployment(hosts, tmp_path, live=True) as run:
        client, keys, processes = run.client, run.keys, run.processes
        for worker in DECODE_WORKERS:
            processes[worker] = start(
                hosts, worker, "decode", str(run.config), "--http", "off", "--worker-id", worker
            )
        wait_for(lambda: decode_owners(client, keys) == DECODE_SHARES, 60, "decoders shared")
        wait_for(
            lambda: all(len(detections(client, keys, c)) >= 5 for c in CAMERAS),
            60,
            "every camera detected",
        )
        cut, other = DECODE_WORKERS
        theirs = sorted(c for c, w in DECODE_SHARES.items() if w == cut)
        hosts.link(cut, up=False)
        cut_at = time.monotonic()
        wait_for(
            lambda: all(decode_owners(client, keys)[c] == other for c in theirs),
            LEASE_TTL_S + 10,
            "the cut decode worker's cameras reopened on the other",
            poll_s=0.05,
        )
        reopened_after = time.monotonic() - cut_at
        time.sleep(max(0.0, 5.0 - reopened_after))
        hosts.link(cut, up=True)
        wait_for(lambda: decode_owners(client, keys) == DECODE_SHARES, 60, "its share back")
        sessions = {c: {m.session for m in detections(client, keys, c)} for c in theirs}
        wait_for(
            lambda: all(
                {m.session for m in detections(client, keys, c)} - sessions[c] for c in theirs
            ),
            60,
            "a new session of each camera handed back",
        )
        for worker in DECODE_WORKERS:
            code, err = stop(processes[worker])
            assert code == 0, err
        wait_for(
            lambda: all(all_read(client, keys.frames(c)) for c in CAMERAS), 60, "all read", 0.2
        )
        for worker in WORKERS:
            code, err = stop(processes[worker])
            assert code == 0, err
        assert reopened_after <= LEASE_TTL_S + 2.0, reopened_after
        for report in audit(client, keys, CAMERAS):
            assert report.ok and report.after_end == 0, report.line()
            if report.camera in theirs:  # the cut one's, the other's, the cut one's again
                assert report.sessions >= 3, report.line()
        events = [f for _id, f in client.xrange(keys.events())]
        crashed = {f[b"camera"].decode() for f in events if f[b"event"] == b"crashed"}
        assert crashed == set(theirs)  # ended by the other from their progress
        fenced = {f[b"camera"].decode() for f in events if f[b"event"] == b"lease_lost"}
        assert fenced == set(theirs)  # back, the cut one's decoders stopped, writing nothing
