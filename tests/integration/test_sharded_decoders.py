"""Decoders sharded by lease, on a real redis-server with real PyAV decoding and the real model:
two ``framebatch decode`` workers and one ``framebatch detect`` worker on four cameras.  The
second decode worker joins and takes its share (the first stops those decoders cleanly first: a
new session each); then one decode worker is SIGKILLed with its decode processes, as a host
lost: its cameras reopen on the other within the lease TTL and 2 s, the frames its sessions
put in Redis are processed and their sessions ended from the progress they kept, and every
frame of every session is detected or dropped with a cause, none twice after de-duplication."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from contextlib import ExitStack, suppress

import pytest
import redis

from framebatch_tools.audit import audit
from pipeline.config import load_config
from pipeline.fleet.sharded import decode_lease
from pipeline.leases.camera_leases import rendezvous_owner
from pipeline.supervisor.decoders import DecoderSupervisor
from pipeline.supervisor.services import open_services
from pipeline.telemetry import NO_TELEMETRY
from streams.embedded_redis import EmbeddedRedis
from streams.groups import all_read
from streams.keys import StreamKeys
from streams.messages import DetectionMessage, message_kind
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import (
    even_pair,
    free_port,
    start_daemon,
    stop_daemon,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

CLIP = SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"
CAMERAS = ["c0", "c1", "c2", "c3"]
LEASE_TTL_S = 2.0
PREFIX = "sharded"
#: two decode workers that rendezvous hashing gives two of the four cameras each
DECODERS = even_pair(CAMERAS, "decode")
SHARES = {camera: rendezvous_owner(camera, DECODERS) for camera in CAMERAS}


def decode_owners(client: redis.Redis, keys: StreamKeys) -> dict[str, str]:
    return {c: (client.get(keys.decode_lease(c)) or b"").decode() for c in CAMERAS}


def sessions_detected(client: redis.Redis, keys: StreamKeys, camera: str) -> set[str]:
    return {
        DetectionMessage.from_fields(fields).session
        for _id, fields in client.xrange(keys.detections(camera))
    }


def start_sharing(config, client: redis.Redis, keys: StreamKeys, processes: dict) -> None:
    """Both decode workers started together: once each decodes its share, every camera
    detected."""
    for worker in DECODERS:
        processes[worker] = start_decoder(config, worker)
    wait_for(lambda: decode_owners(client, keys) == SHARES, 60, "the cameras shared")
    wait_for(lambda: all(sessions_detected(client, keys, c) for c in CAMERAS), 120, "detected")


def wait_for_new_sessions(
    client: redis.Redis, keys: StreamKeys, before: dict[str, set[str]]
) -> None:
    """Until each camera of ``before`` has a session detected that it did not have then."""
    wait_for(
        lambda: all(sessions_detected(client, keys, c) - seen for c, seen in before.items()),
        60,
        "a new session of each lost camera detected",
    )


def stop_in_order(client: redis.Redis, keys: StreamKeys, processes: dict, decoders: list) -> None:
    """The decode workers stopped (each writes its sessions' ends), then the detector worker
    once it read every stream to its end: each exits 0."""
    for worker in decoders:
        code, _out, err = stop_daemon(processes[worker])
        assert code == 0, err[-3000:]
    code, err = stop_when_read(client, keys, processes["detect"])
    assert code == 0, err[-3000:]


def stop_the_rest(processes: dict) -> None:
    for process in processes.values():
        if process.poll() is None:
            stop_daemon(process)


def live_config(path, url: str, lease_ttl_s: float = LEASE_TTL_S):
    """The four cameras as looped clips paced at 5 frames/s, standing for live cameras (they
    restart, shed, are handed over); 20 frames/s in all, within what the model keeps up with
    here."""
    return write_config(
        path,
        model=MODEL,
        cameras=[
            {"id": c, "url": str(CLIP), "loop": True, "realtime": True, "fps": 5} for c in CAMERAS
        ],
        redis_url=url,
        prefix=PREFIX,
        redis={"url": url, "prefix": PREFIX, "lease_ttl_s": lease_ttl_s},
        max_batch_size=4,
    )


def stop_when_read(client: redis.Redis, keys: StreamKeys, detect) -> tuple[int, str]:
    """Once every frames stream is read to its end, the detector worker stopped: its exit code
    and its log."""
    wait_for(
        lambda: all(all_read(client, keys.frames(c)) for c in CAMERAS),
        60,
        "every frames stream read to its end",
        poll_s=0.2,
    )
    code, _out, err = stop_daemon(detect)
    return code, err


def start_decoder(config, worker: str):
    """A decode worker in a process group of its own: killed with its decode processes."""
    return start_daemon(
        config, "--http", "off", "--worker-id", worker, command="decode", own_group=True
    )


def test_decode_workers_share_the_cameras_and_a_lost_ones_reopen_elsewhere(assets, tmp_path):
    keys = StreamKeys(PREFIX)
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = live_config(tmp_path / "sharded.yaml", server.url)
        first, second = DECODERS
        processes = {"detect": start_daemon(config, "--http", "off", command="detect")}
        try:
            processes[first] = start_decoder(config, first)
            wait_for(
                lambda: set(decode_owners(client, keys).values()) == {first}, 60, "all decoded"
            )
            wait_for(
                lambda: all(sessions_detected(client, keys, c) for c in CAMERAS), 120, "detected"
            )
            # the second joins: it takes its share once the first stopped those decoders
            processes[second] = start_decoder(config, second)
            wait_for(lambda: decode_owners(client, keys) == SHARES, 30, "the cameras shared")
            theirs = sorted(c for c, w in SHARES.items() if w == second)
            wait_for(
                lambda: all(len(sessions_detected(client, keys, c)) >= 2 for c in theirs),
                60,
                "a new session of each camera handed over",
            )
            # the first is lost with its decode processes, as a host would be
            victim = first
            lost = sorted(c for c, w in SHARES.items() if w == victim)
            before_kill = {c: sessions_detected(client, keys, c) for c in lost}
            os.killpg(processes[victim].pid, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(
                lambda: all(decode_owners(client, keys)[c] == second for c in lost),
                LEASE_TTL_S + 10,
                "the lost worker's cameras reopened",
                poll_s=0.02,
            )
            reopened_after = time.monotonic() - killed_at
            wait_for_new_sessions(client, keys, before_kill)
            # every session ended (the killed ones from their progress): read to the end
            stop_in_order(client, keys, processes, [second])
        finally:
            stop_the_rest(processes)
        assert reopened_after <= LEASE_TTL_S + 2.0, reopened_after
        for report in audit(client, keys, CAMERAS):
            assert report.ok, report.line()
            assert report.detected > 0 and report.sessions >= 2, report.line()
        crashed = [
            fields
            for _id, fields in client.xrange(keys.events())
            if fields.get(b"event") == b"crashed"
        ]
        assert {f[b"camera"].decode() for f in crashed} == set(lost)  # ended by the other
        assert not client.zrange(keys.decode_workers(), 0, -1)  # the one stopped left


def test_a_decode_worker_killed_alone_lets_its_cameras_go_before_their_leases_run_out(
    assets, tmp_path
):
    """The daemon alone SIGKILLed (a crash, the OOM killer), its decode processes outliving it a
    moment: they tell its decoders to stop, let go of its leases and drop its heartbeat, so the
    other worker takes its cameras at its next tick, not once their minute-long leases run
    out. Each old session ends once: by its decoder (its end entry, written before the lease
    went) or, fenced out, by the other worker from its progress; every frame is detected or
    dropped with a cause."""
    keys = StreamKeys(PREFIX)
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = live_config(tmp_path / "will.yaml", server.url, lease_ttl_s=60.0)
        processes = {"detect": start_daemon(config, "--http", "off", command="detect")}
        victim, survivor = DECODERS
        try:
            start_sharing(config, client, keys, processes)
            lost = sorted(c for c, w in SHARES.items() if w == victim)
            before_kill = {c: sessions_detected(client, keys, c) for c in lost}
            os.kill(processes[victim].pid, signal.SIGKILL)  # the worker, not its group
            try:
                wait_for(
                    lambda: all(decode_owners(client, keys)[c] == survivor for c in lost),
                    30,  # half the TTL: only the last will frees them in time
                    "the killed worker's cameras reopened before their leases ran out",
                )
            except AssertionError as timed_out:  # what its decode processes said, if anything
                os.killpg(processes[victim].pid, signal.SIGKILL)
                log = processes[victim].communicate(timeout=30)[1]
                raise AssertionError(f"{timed_out}; its log:\n{log[-5000:]}") from None
            _out, err = processes[victim].communicate(timeout=30)  # its decode processes left
            wait_for_new_sessions(client, keys, before_kill)
            stop_in_order(client, keys, processes, [survivor])
        finally:
            with suppress(ProcessLookupError):
                os.killpg(processes[victim].pid, signal.SIGKILL)
            stop_the_rest(processes)
        assert re.search(rf"decode worker {victim} is gone: [12] lease\(s\)", err), err[-3000:]
        for report in audit(client, keys, CAMERAS):
            assert report.ok, report.line()
        said = [
            (fields[b"camera"].decode(), fields[b"event"].decode())
            for _id, fields in client.xrange(keys.events())
            if fields.get(b"camera", b"").decode() in lost
        ]
        for camera in lost:
            ends = [event for c, event in said if c == camera and event in ("ended", "crashed")]
            assert len(ends) == 2, said  # the old session's, and the survivor's at its stop


def test_a_decode_worker_paused_past_its_lease_writes_nothing_after_its_sessions_ended(
    assets, tmp_path
):
    """A decode worker frozen (SIGSTOP, with its decode processes: a VM paused, a stalled host)
    past its lease: its cameras reopen on the other worker, which ends their sessions from their
    progress.  Thawed, its decoders resume mid-frame, before their supervisor's tick can tell
    them anything: the fence refuses what they write, and they stop (``lease_lost``).  No frame
    follows its session's end; every frame is detected or dropped with a cause."""
    keys = StreamKeys(PREFIX)
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = live_config(tmp_path / "paused.yaml", server.url)
        processes = {"detect": start_daemon(config, "--http", "off", command="detect")}
        try:
            start_sharing(config, client, keys, processes)
            paused, other = DECODERS
            theirs = sorted(c for c, w in SHARES.items() if w == paused)
            os.killpg(processes[paused].pid, signal.SIGSTOP)
            try:
                wait_for(
                    lambda: all(decode_owners(client, keys)[c] == other for c in theirs),
                    LEASE_TTL_S + 10,
                    "the paused worker's cameras reopened",
                )
                wait_for(
                    lambda: all(len(sessions_detected(client, keys, c)) >= 2 for c in theirs),
                    60,
                    "a new session of each",
                )
            finally:
                os.killpg(processes[paused].pid, signal.SIGCONT)
            wait_for(lambda: decode_owners(client, keys) == SHARES, 60, "its share back")
            stop_in_order(client, keys, processes, list(DECODERS))
        finally:
            stop_the_rest(processes)
        for report in audit(client, keys, CAMERAS):
            assert report.ok and report.after_end == 0, report.line()
        events = [f for _id, f in client.xrange(keys.events())]
        fenced = {f[b"camera"].decode() for f in events if f[b"event"] == b"lease_lost"}
        assert fenced == set(theirs)


def test_a_file_job_is_decoded_once_even_when_its_decode_worker_is_lost(assets, tmp_path):
    keys = StreamKeys(PREFIX)
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = write_config(
            tmp_path / "files.yaml",
            model=MODEL,
            # file jobs wait for room in their 4-frame streams: paced by the detector worker
            cameras=[{"id": c, "url": str(CLIP), "realtime": False} for c in CAMERAS],
            redis_url=server.url,
            prefix=PREFIX,
            redis={
                "url": server.url,
                "prefix": PREFIX,
                "lease_ttl_s": LEASE_TTL_S,
                "frames_maxlen": 4,
            },
            max_batch_size=4,
        )
        processes = {"detect": start_daemon(config, "--http", "off", command="detect")}
        try:
            for worker in DECODERS:
                processes[worker] = start_decoder(config, worker)
            wait_for(lambda: client.xlen(keys.detections("c0")) >= 5, 120, "c0 detected")
            victim = decode_owners(client, keys)["c0"]
            lost = sorted(c for c, w in decode_owners(client, keys).items() if w == victim)
            os.killpg(processes[victim].pid, signal.SIGKILL)
            survivor = next(w for w in DECODERS if w != victim)
            # it ends the lost worker's files (decoded no further), finishes its own, and exits
            # 1: those cameras' jobs ended before their files did
            code = processes[survivor].wait(120)
            err = processes[survivor].stderr.read()
            assert code == 1, err[-3000:]
            for camera in lost:
                assert f"crashed camera {camera!r}: its decode worker was lost" in err
            code, err = stop_when_read(client, keys, processes["detect"])
            assert code == 1, err[-3000:]  # its summary says which files ended crashed
        finally:
            for process in processes.values():
                if process.poll() is None:
                    stop_daemon(process)
        for report in audit(client, keys, CAMERAS):
            assert report.ok and report.sessions == 1, report.line()  # never decoded twice
            if report.camera not in lost:
                assert report.detected == 60, report.line()
        assert all(client.get(keys.decoded(c)) for c in CAMERAS)


def test_decode_workers_take_cameras_up_to_their_capacity_and_report_what_fits_nowhere(
    assets, tmp_path
):
    keys = StreamKeys(PREFIX)
    looping = {"url": str(CLIP), "loop": True, "realtime": True, "fps": 5}
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = write_config(
            tmp_path / "capacity.yaml",
            model=MODEL,
            # a main stream that costs two of the sub-streams' decoding, and two sub-streams
            cameras=[
                {"id": "main", "decode_weight": 2, **looping},
                {"id": "sub1", **looping},
                {"id": "sub2", **looping},
            ],
            redis_url=server.url,
            prefix=PREFIX,
            redis={"url": server.url, "prefix": PREFIX, "lease_ttl_s": LEASE_TTL_S},
            decoding={"worker_capacity": 2},
        )
        ports = {worker: free_port() for worker in DECODERS}
        processes = {}

        def decoder(worker: str):
            args = ("--http", f"127.0.0.1:{ports[worker]}", "--worker-id", worker)
            return start_daemon(config, *args, command="decode")

        def placement(worker: str) -> dict:
            url = f"http://127.0.0.1:{ports[worker]}/api/decoders"
            with urllib.request.urlopen(url, timeout=5) as reply:
                return json.loads(reply.read())

        def owners() -> dict[str, str]:
            names = ["main", "sub1", "sub2"]
            return {c: (client.get(keys.decode_lease(c)) or b"").decode() for c in names}

        first, second = DECODERS
        try:
            processes[first] = decoder(first)
            # alone, the first has room for the main stream only: the sub-streams fit nowhere
            wait_for(lambda: owners() == {"main": first, "sub1": "", "sub2": ""}, 60, "main")
            status = wait_for(
                lambda: (s := _quietly(placement, first)) and s["unplaced"] and s, 30, "a plan"
            )
            assert status["unplaced"] == ["sub1", "sub2"] and status["decoding"] == ["main"]
            assert status["workers"][first] == {"capacity": 2.0, "load": 2.0}
            metrics = _get(f"http://127.0.0.1:{ports[first]}/metrics")
            assert "framebatch_decode_unplaced_cameras 2.0" in metrics
            # a second worker with room for two: every camera placed, spread by weight
            processes[second] = decoder(second)
            wait_for(
                lambda: "" != (o := owners())["sub1"] == o["sub2"] != o["main"] != "",
                60,
                "every camera placed: the main stream on one worker, the sub-streams on the other",
            )
            wait_for(lambda: placement(first)["unplaced"] == [], 10, "nothing unplaced")
            for process in processes.values():
                code, _out, err = stop_daemon(process)
                assert code == 0, err[-3000:]
        finally:
            for process in processes.values():
                if process.poll() is None:
                    stop_daemon(process)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read().decode()


def _quietly(call, *args):
    """``call(*args)``, or None while the endpoint is not up yet."""
    try:
        return call(*args)
    except OSError:
        return None


def test_a_decoder_stopped_before_its_process_began_it_still_ends_its_session(assets, tmp_path):
    """A worker that stops while a camera's start is still in the pipe to its decode process
    (the process stops before it reads it) claimed a session that no decoder will end: the
    worker ends it from its progress as it closes, so nothing waits on that session."""
    keys = StreamKeys(PREFIX)
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = load_config(live_config(tmp_path / "sharded.yaml", server.url))
        with ExitStack() as stack:
            services = open_services(config, stack, telemetry=NO_TELEMETRY, live_view=False)
            lease = decode_lease(config, "stopping")
            decoders = DecoderSupervisor(config, services, rings_read_here=False, lease=lease)
            decoders.add(config.cameras[0])  # its session claimed, its process just spawned
            session = client.hget(keys.progress("c0"), "session")
            assert session is not None
            decoders.stop()  # before the new process gets to read its pipe
            decoders.close()
        assert not client.exists(keys.progress("c0")), "a session left in progress"
        ends = [
            fields
            for _id, fields in client.xrange(keys.frames("c0"))
            if message_kind(fields) == "end"
        ]
        assert [end[b"session"] for end in ends] == [session]
