"""The fleet: ``python -m framebatch_tools.bench.fleet [--cameras 1000] [--hosts 1,2,4]
[--redis single,cluster] [--faults]``.

A thousand cameras over decode and detect workers on hosts of their own (network namespaces,
``framebatch_tools.netns``: each host its own network stack and cable to a switch), sharing one
Redis (or a three-master Redis Cluster) on a host of its own, the cameras in the registry.
Each host count n runs n ``framebatch decode`` workers (real processes, real decoders, leases
and fence; ``--capacity`` cameras each) and n ``framebatch detect`` workers (real reader,
batching, publisher, acknowledgements, leases) with the **simulated detector** of
``bench.scale`` (a batch of b sleeps ``base + per_frame x b`` ms, as a GPU per worker would).
A camera is a tiny generated clip (64x64 H.264, a key frame a second) replayed as a live camera
at ``--fps``: it costs almost nothing to decode, so what is measured is the fleet's own work.

Measured per host count, after every placeable camera is decoded and a warm-up: detections
published per second over a window (target: n hosts >= 0.9 x n x one host), Redis commands per
frame (INFO commandstats over the window, every node, every process's commands: frames,
leases, registry, reads, acknowledgements), the time from the workers' start to every camera
placed; at the largest count, a registry change travelling: a camera removed until it is
drained and retired, added again until its first frame is detected.

``--faults``: at the largest count, with capacity for a host fewer (``cameras / (n - 1)``), one
decode host's cable pulled for 5 s and put back, then, while the fleet still hands that host's
cameras back, another decode worker SIGKILLed: the time until each of their cameras has its
lease taken and runs a new session elsewhere (target: ``lease_ttl + 2 s``), then,
the decoders stopped and every frames stream read, the audit of every camera
(``framebatch_tools.audit``): every frame of every session detected or dropped with a cause,
none after its session's end, duplicates counted (at-least-once) and removed by frame id.

Needs root and iproute2 (``ip netns``), ``redis-server`` and ffmpeg.  The driver runs on the
Redis host (``Hosts.enter``): a Redis Cluster's nodes announce that host's address.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import redis
import yaml

from framebatch_tools.audit import audit
from framebatch_tools.bench.scale import IMGSZ, ServiceTime
from framebatch_tools.local_cluster import LocalRedisCluster
from framebatch_tools.netns import Hosts, netns_available
from pipeline.config import CameraConfig
from pipeline.fleet.registry import CameraRegistry
from samples.generate import SyntheticClip, encode
from streams.embedded_redis import EmbeddedRedis
from streams.groups import all_read
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import DetectionMessage
from streams.redis_connect import connect

PREFIX = "fleet"
CLIP = SyntheticClip("fleet_64x64_1fps.mp4", "testsrc2", IMGSZ, IMGSZ, 1, 20, gop=1)
REDIS_PORT = 6379
LEASE_TTL_S = 3.0
MAX_BATCH = 32
START_TIMEOUT_S = 300.0  # every camera placed: 250 decoders a worker open on two cores
CUT_S = 5.0
HAND_BACK_S = 0.5  # after the cut host has a share again, until the SIGKILL of another
SETTLED_S = 2.0  # a camera's hand-over takes well under a second when nothing else runs


@dataclass(frozen=True)
class FleetShape:
    cameras: int
    hosts: int  # decode hosts, and as many detect hosts
    capacity: float  # cameras one decode worker takes
    fps: float
    service: ServiceTime
    cluster: bool

    @property
    def label(self) -> str:
        return f"{'cluster' if self.cluster else 'single'}-{self.hosts}"

    @property
    def placeable(self) -> int:
        return min(self.cameras, self.hosts * math.floor(self.capacity))


@dataclass(frozen=True)
class Placing:
    """Seconds from the workers' start until every placeable camera was decoded somewhere,
    and until no camera moved between decode workers any more."""

    placed_after_s: float
    settled_after_s: float


@dataclass
class FleetRun:
    """What one fleet shape measured (``figures`` for the JSON, ``line`` for people)."""

    redis: str
    hosts: int
    cameras_placed: int
    placed_after_s: float
    #: until no camera moved between decode workers for SETTLED_S (those that joined last
    #: take their share after every camera is decoded somewhere): measuring starts after it
    settled_after_s: float
    frames_per_s: float
    redis_calls_per_frame: float
    top_commands: dict[str, float]
    cpu_ms_per_frame: dict[str, float] = field(default_factory=dict)
    #: from a frame's XADD until its detection is published, over the window (p50, p99)
    latency_ms: dict[str, float] = field(default_factory=dict)
    propagation: dict[str, list[float]] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)


def camera_ids(count: int) -> list[str]:
    return [f"c{index:04d}" for index in range(count)]


def camera_entry(camera: str, clip: Path, fps: float) -> dict[str, Any]:
    """A looped tiny clip replayed as the live camera it stands for."""
    return {"id": camera, "url": str(clip), "as_live": True, "loop": True, "fps": fps}


def write_config(path: Path, url: str, shape: FleetShape, clip: Path) -> Path:
    model = path.parent / "simulated.onnx"  # never opened: the detector is simulated
    model.write_bytes(b"\x08")
    config = {
        "redis": {
            "url": url,
            "prefix": PREFIX,
            "cluster": shape.cluster,
            "lease_ttl_s": LEASE_TTL_S,
            "frames_maxlen": 8,
        },
        "model": {"path": str(model), "imgsz": IMGSZ, "rect": False},
        "batching": {"max_batch_size": MAX_BATCH, "max_wait_ms": 50},
        "transport": {"kind": "raw"},  # other hosts: no shared memory between them
        "decoding": {"cameras_per_process": 256},
        "http": {"listen": None},
        # the rest are the registry's (seeded by the driver): a config holds 256 at most
        "cameras": [camera_entry(camera_ids(1)[0], clip, shape.fps)],
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def redis_on(hosts: Hosts, cluster: bool) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """A Redis (or a Redis Cluster) on the ``redis`` host, which this process is on: its URL
    and every node's address."""
    address = hosts.addresses["redis"]
    # no password: the switch is private to this run, nothing else is on it
    open_to_hosts = ("--protected-mode", "no")
    if cluster:
        with LocalRedisCluster(host=address, extra_args=open_to_hosts) as nodes:
            yield nodes.url, [(address, port) for port in nodes.ports]
    else:
        with EmbeddedRedis(port=REDIS_PORT, bind=address, extra_args=open_to_hosts) as server:
            yield server.url, [(address, REDIS_PORT)]


def command_calls(nodes: list[tuple[str, int]]) -> dict[str, int]:
    """Calls per command since the nodes started, summed over the nodes."""
    calls: dict[str, int] = {}
    for host, port in nodes:
        with redis.Redis(host, port) as client:
            for name, stat in client.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                calls[command] = calls.get(command, 0) + int(stat["calls"])
    return calls


def each_camera(
    client: redis.Redis, cameras: list[str], command: Callable[[Any, str], Any], *, missing=None
):
    """``command(pipe, camera)`` for every camera, in one pipeline (per node, on a cluster);
    ``missing``: what a command that failed (a stream not made yet) gives instead."""
    pipe = client.pipeline(transaction=False)
    for camera in cameras:
        command(pipe, camera)
    results = pipe.execute(raise_on_error=False)
    failed = [r for r in results if isinstance(r, Exception)]
    if failed and missing is None:
        raise failed[0]
    return [missing if isinstance(r, Exception) else r for r in results]


def detections_count(client: redis.Redis, keys: StreamKeys, cameras: list[str]) -> int:
    return sum(each_camera(client, cameras, lambda p, c: p.xlen(keys.detections(c))))


def backlog(client: redis.Redis, keys: StreamKeys, cameras: list[str]) -> int:
    """Frames waiting in the frames streams: not yet delivered, or delivered and not acked."""
    waiting = 0
    infos = each_camera(client, cameras, lambda p, c: p.xinfo_groups(keys.frames(c)), missing=[])
    for groups in infos:  # an unplaced camera has no stream yet
        for group in groups:
            if group["name"] in (FRAMES_GROUP, FRAMES_GROUP.encode()):
                waiting += int(group.get("lag") or 0) + int(group["pending"])
    return waiting


def decode_owners(client: redis.Redis, keys: StreamKeys, cameras: list[str]) -> dict[str, str]:
    owners = each_camera(client, cameras, lambda p, c: p.get(keys.decode_lease(c)))
    return {c: o.decode() for c, o in zip(cameras, owners, strict=True) if o is not None}


def sessions(client: redis.Redis, keys: StreamKeys, cameras: list[str]) -> dict[str, bytes]:
    """The session in progress of each camera (its decoder's claim)."""
    found = each_camera(client, cameras, lambda p, c: p.hget(keys.progress(c), "session"))
    return {c: s for c, s in zip(cameras, found, strict=True) if s is not None}


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # after the name, which may hold spaces


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of a process and its descendants alive now."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
            times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return total


def redis_cpu_s(nodes: list[tuple[str, int]]) -> float:
    total = 0.0
    for host, port in nodes:
        with redis.Redis(host, port) as client:
            info = client.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def say(what: str) -> None:
    """Progress, on stderr (the workers' logs have the same clock)."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(poll_s)
    raise RuntimeError(f"not within {timeout_s:.0f} s: {what}")


class Workers:
    """The fleet's processes on their hosts, their logs in ``logs``."""

    def __init__(self, hosts: Hosts, config: Path, logs: Path):
        self._hosts, self._config, self._logs = hosts, config, logs
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, host: str, argv: list[str]) -> None:
        with open(self._logs / f"{host}.log", "ab") as log:
            self.processes[host] = subprocess.Popen(
                self._hosts.command(host, [sys.executable, "-m", *argv]),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def detect(self, host: str, service: ServiceTime) -> None:
        rates = f"{service.base_ms},{service.per_frame_ms}"
        module = "framebatch_tools.bench.scale"  # its simulated-detector worker
        self.start(host, [module, "--worker", str(self._config), host, "--service", rates])

    def decode(self, host: str, capacity: float) -> None:
        argv = ["pipeline.cli", "decode", str(self._config), "--http", "off"]
        self.start(host, [*argv, "--worker-id", host, "--capacity", f"{capacity:g}"])

    def stop(self, hosts: list[str], timeout_s: float = 60) -> None:
        chosen = [self.processes[h] for h in hosts if h in self.processes]
        for process in chosen:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in chosen:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def check_alive(self) -> None:
        for host, process in self.processes.items():
            if process.poll() is not None:
                tail = (self._logs / f"{host}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{host} exited ({process.returncode}):\n{tail}")


def host_names(count: int) -> tuple[list[str], list[str]]:
    return [f"dec{n}" for n in range(1, count + 1)], [f"det{n}" for n in range(1, count + 1)]


@contextmanager
def fleet(
    hosts: Hosts, shape: FleetShape, clip: Path, folder: Path
) -> Iterator[tuple[redis.Redis, StreamKeys, Workers, list[tuple[str, int]], Placing]]:
    """The Redis, the registered cameras and the workers of ``shape``, every placeable camera
    decoded and none moving: yields the client, the keys, the workers, the Redis nodes and how
    long placing took."""
    decoders, detectors = host_names(shape.hosts)
    with ExitStack() as stack:
        url, nodes = stack.enter_context(redis_on(hosts, shape.cluster))
        client = connect(url, cluster=shape.cluster)
        stack.callback(client.close)
        keys = StreamKeys(PREFIX)
        config = write_config(folder / "fleet.yaml", url, shape, clip)
        cameras = camera_ids(shape.cameras)
        CameraRegistry(client, keys).seed(
            CameraConfig(**camera_entry(c, clip, shape.fps)) for c in cameras
        )
        logs = folder / "logs" / f"{time.strftime('%H%M%S')}-{shape.label}"
        logs.mkdir(parents=True)
        workers = Workers(hosts, config, logs)
        stack.callback(workers.stop, detectors)  # last: they read what the decoders left
        stack.callback(workers.stop, decoders)
        started = time.monotonic()
        for host in detectors:
            workers.detect(host, shape.service)
        for host in decoders:
            workers.decode(host, shape.capacity)

        def placed() -> bool:
            workers.check_alive()
            return len(sessions(client, keys, cameras)) >= shape.placeable

        say(f"{shape.label}: workers started")
        wait_for(placed, START_TIMEOUT_S, f"{shape.placeable} cameras decoded", poll_s=0.5)
        say(f"{shape.label}: every camera placed")
        placed_after = time.monotonic() - started
        wait_for(lambda: client.zcard(keys.workers()) == shape.hosts, 60, "detect workers")
        settle(client, keys, workers, cameras, shape.hosts)
        say(f"{shape.label}: settled")
        yield client, keys, workers, nodes, Placing(placed_after, time.monotonic() - started)


def settle(
    client: redis.Redis, keys: StreamKeys, workers: Workers, cameras: list[str], hosts: int
) -> None:
    """Until every decode worker is in and no camera changed its session for SETTLED_S:
    cameras handed over to the decode workers that joined last start new sessions, which on
    this 2-core machine costs enough CPU to hold the detect workers back for seconds (a
    window that caught them had a 5.7 s p99 latency; docs/benchmarks.md)."""
    last: dict[str, bytes] = {}
    since = time.monotonic()

    def still() -> bool:
        nonlocal last, since
        workers.check_alive()
        now = sessions(client, keys, cameras)
        if now != last or client.zcard(keys.decode_workers()) != hosts:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= SETTLED_S

    wait_for(still, START_TIMEOUT_S, "no camera moving between decode workers", poll_s=0.5)


def throughput(
    client: redis.Redis,
    keys: StreamKeys,
    nodes: list[tuple[str, int]],
    workers: Workers,
    cameras: list[str],
    window_s: float,
) -> tuple[float, float, dict[str, float], dict[str, float]]:
    """Detections per second over the window, Redis calls per frame, the top commands' and
    the CPU each role spent per frame (ms: decode workers with their decode processes, detect
    workers, Redis)."""

    def cpu() -> dict[str, float]:
        spent = {"decode": 0.0, "detect": 0.0, "redis": redis_cpu_s(nodes)}
        for host, process in workers.processes.items():
            spent["decode" if host.startswith("dec") else "detect"] += tree_cpu_s(process.pid)
        return spent

    first = detections_count(client, keys, cameras)
    calls_before, cpu_before, started = command_calls(nodes), cpu(), time.monotonic()
    time.sleep(window_s)
    calls_after, cpu_after, ended = command_calls(nodes), cpu(), time.monotonic()
    frames = max(detections_count(client, keys, cameras) - first, 1)
    spent = {c: n - calls_before.get(c, 0) for c, n in calls_after.items()}
    spent.pop("info", None)  # ours
    per_frame = {c: n / frames for c, n in spent.items() if n}
    top = dict(sorted(per_frame.items(), key=lambda kv: -kv[1])[:8])
    cpu_ms = {role: 1000 * (cpu_after[role] - cpu_before[role]) / frames for role in cpu_after}
    return frames / (ended - started), sum(per_frame.values()), top, cpu_ms


def latencies(
    client: redis.Redis, keys: StreamKeys, cameras: list[str], *, since: float, last: int = 8
) -> list[float]:
    """Seconds from each frame's XADD until its detection was published, for the ``last``
    detections of each camera published since ``since`` (wall clock)."""
    pipe = client.pipeline(transaction=False)
    for camera in cameras:
        pipe.xrevrange(keys.detections(camera), count=last)
    waits = []
    for entries in pipe.execute():
        for _id, fields in entries:
            stamps = DetectionMessage.from_fields(fields).timestamps
            if stamps.published >= since:
                waits.append(stamps.published - stamps.enqueued)
    return waits


def propagation(
    client: redis.Redis, keys: StreamKeys, cameras: list[str], clip: Path, fps: float, times: int
) -> dict[str, list[float]]:
    """A camera removed through the registry until drained and retired (its decoder stopped,
    its stream read to the end), then added again until its first frame is detected."""
    registry = CameraRegistry(client, keys)
    removed, added = [], []
    for camera in cameras[1 : times + 1]:  # not the config's: a restart would seed it again
        started = time.monotonic()
        registry.remove(camera)
        wait_for(lambda c=camera: registry.get(c) is None, 60, f"{camera} retired", 0.02)
        removed.append(time.monotonic() - started)
        before = client.xlen(keys.detections(camera))
        started = time.monotonic()
        registry.add(CameraConfig(**camera_entry(camera, clip, fps)))
        wait_for(
            lambda c=camera, n=before: client.xlen(keys.detections(c)) > n,
            60,
            f"{camera} back",
            0.02,
        )
        added.append(time.monotonic() - started)
    return {"removed_until_retired_s": removed, "added_until_detected_s": added}


def unread(client: redis.Redis, keys: StreamKeys, cameras: list[str]) -> list[tuple[str, Any]]:
    """The cameras whose frames stream is not read to its end, with its group's state."""
    return [
        (c, client.xinfo_groups(keys.frames(c)))
        for c in cameras
        if not all_read(client, keys.frames(c))
    ]


SAID = (b"kind", b"session", b"seq", b"frames", b"reason")  # of a stuck entry


def stuck(client: redis.Redis, keys: StreamKeys, cameras: list[str], shown: int = 5) -> list:
    """What is pending on the first ``shown`` of ``cameras``, on whom, and what it is."""
    found = []
    for camera in cameras[:shown]:
        key = keys.frames(camera)
        for entry in client.xpending_range(key, FRAMES_GROUP, "-", "+", 5):
            fields = client.xrange(key, entry["message_id"], entry["message_id"])
            told = "trimmed"
            if fields:  # what the entry is, without its pixels
                told = {k.decode(): v.decode() for k, v in fields[0][1].items() if k in SAID}
            found.append((camera, entry, told))
    return found


def reopened_after(
    client: redis.Redis, keys: StreamKeys, host: str, theirs: list[str], since: float, before: dict
) -> dict[str, float]:
    """Seconds from ``since`` until every one of ``theirs`` (``host``'s cameras) had its decode
    lease taken by another worker (and until half of them had: a few late ones are not the
    whole host late), and until every one had run a new session there.  Each camera's first
    new session counts: one taken under the plan that still had ``host`` in it (it was
    handing the camera over) may move again once the plan drops ``host``, its capacity
    reshuffled (a hand-over, a session more), and that second move is not its reopening."""
    taken: dict[str, float] = {}
    reopened: dict[str, float] = {}

    def moved() -> bool:
        if len(taken) < len(theirs):
            owners = decode_owners(client, keys, theirs)
            now = time.monotonic() - since  # once seen: a poll late on a starved host adds
            for camera in theirs:
                if camera not in taken and owners.get(camera) not in (None, host):
                    taken[camera] = now
        running = sessions(client, keys, theirs)
        now = time.monotonic() - since
        for camera in theirs:
            if camera not in reopened and running.get(camera) not in (None, before.get(camera)):
                reopened[camera] = now
        return len(reopened) == len(theirs)

    wait_for(moved, LEASE_TTL_S + 30, "the lost decoders' cameras reopened", poll_s=0.05)
    times = sorted(taken.values()) or [max(reopened.values())]
    return {
        "leases_half_taken_s": times[(len(times) - 1) // 2],
        "leases_taken_s": times[-1] if len(taken) == len(theirs) else max(reopened.values()),
        "reopened_s": max(reopened.values()),
    }


def faults(
    hosts: Hosts,
    client: redis.Redis,
    keys: StreamKeys,
    workers: Workers,
    shape: FleetShape,
) -> dict[str, Any]:
    """A decode host cut off for 5 s, then another SIGKILLed; then everything drained and
    audited."""
    cameras = camera_ids(shape.cameras)
    decoders, detectors = host_names(shape.hosts)
    cut, killed = decoders[0], decoders[1]
    figures: dict[str, Any] = {}
    for fault, host in (("cut_5s", cut), ("sigkill", killed)):
        owners = decode_owners(client, keys, cameras)
        theirs = sorted(c for c, o in owners.items() if o == host)
        before = sessions(client, keys, theirs)
        since = time.monotonic()
        say(f"{fault} {host}: {len(theirs)} cameras")
        if fault == "cut_5s":
            hosts.link(host, up=False)
        else:
            workers.processes[host].kill()
        figures[fault] = {
            "cameras": len(theirs),
            **reopened_after(client, keys, host, theirs, since, before),
        }
        say(f"{fault} {host}: its cameras reopened elsewhere")
        if fault == "cut_5s":
            time.sleep(max(0.0, since + CUT_S - time.monotonic()))
            hosts.link(host, up=True)
            say(f"{host}: cable back")
            wait_for(
                lambda h=host: any(o == h for o in decode_owners(client, keys, cameras).values()),
                60,
                f"{host} back with a share",
            )
            # the SIGKILL lands while the fleet still hands the cut host's cameras back (each
            # waits for its decoder to stop; seconds for 257 on this box): the harder case
            time.sleep(HAND_BACK_S)
    workers.stop(decoders)
    say("decode workers stopped")
    in_progress = sessions(client, keys, cameras)
    if in_progress:  # every decoder stopped wrote its end, or was ended by its successor
        raise RuntimeError(f"{len(in_progress)} sessions never ended: {sorted(in_progress)[:5]}")
    try:
        wait_for(lambda: not unread(client, keys, cameras), 120, "every frame read", 1.0)
    except RuntimeError:
        left = [camera for camera, _groups in unread(client, keys, cameras)]
        raise RuntimeError(
            f"{len(left)} frames streams not read to the end: {stuck(client, keys, left)}"
        ) from None
    workers.stop(detectors)
    reports = audit(client, keys, cameras)
    dropped: dict[str, int] = {}
    for report in reports:
        for cause, count in report.dropped.items():
            dropped[cause] = dropped.get(cause, 0) + count
    figures["audit"] = {
        "frames": sum(r.frames for r in reports),
        "detected": sum(r.detected for r in reports),
        "dropped": dropped,
        "unaccounted": sum(len(r.unaccounted) for r in reports),
        "duplicates_removed": sum(r.duplicates for r in reports),
        "after_session_end": sum(r.after_end for r in reports),
        "sessions": sum(r.sessions for r in reports),
        "not_ok": [f"{r.line()}; unaccounted {r.unaccounted[:10]}" for r in reports if not r.ok][
            :5
        ],
    }
    return figures


def measure(
    hosts: Hosts, shape: FleetShape, clip: Path, folder: Path, window_s: float, changes: int
) -> FleetRun:
    cameras = camera_ids(shape.cameras)
    with fleet(hosts, shape, clip, folder) as (client, keys, workers, nodes, placing):
        # steady: what queued while the cameras were placed is read (a frame a camera, less)
        try:
            wait_for(
                lambda: backlog(client, keys, cameras) <= shape.placeable // 4,
                120,
                "the backlog of the start read",
                poll_s=1.0,
            )
        except RuntimeError:
            late = [c for c, _groups in unread(client, keys, cameras)]
            raise RuntimeError(
                f"the backlog of the start read is {backlog(client, keys, cameras)} frames "
                f"after 120 s; {len(late)} streams not read to the end: "
                f"{stuck(client, keys, late)}"
            ) from None
        time.sleep(3.0)
        window_start = time.time()
        rate, per_frame, top, cpu_ms = throughput(client, keys, nodes, workers, cameras, window_s)
        workers.check_alive()
        waits = latencies(client, keys, cameras, since=window_start)
        run = FleetRun(
            redis="cluster" if shape.cluster else "single",
            hosts=shape.hosts,
            cameras_placed=shape.placeable,
            placed_after_s=placing.placed_after_s,
            settled_after_s=placing.settled_after_s,
            frames_per_s=rate,
            redis_calls_per_frame=per_frame,
            top_commands=top,
            cpu_ms_per_frame=cpu_ms,
            latency_ms={}
            if len(waits) < 2
            else {
                "p50": 1000 * statistics.median(waits),
                "p99": 1000 * statistics.quantiles(waits, n=100)[98],
            },
        )
        if changes:
            run.propagation = propagation(client, keys, cameras, clip, shape.fps, changes)
        return run


def measure_faults(hosts: Hosts, shape: FleetShape, clip: Path, folder: Path) -> FleetRun:
    with fleet(hosts, shape, clip, folder) as (client, keys, workers, _nodes, placing):
        time.sleep(5.0)
        run = FleetRun(
            redis="cluster" if shape.cluster else "single",
            hosts=shape.hosts,
            cameras_placed=shape.placeable,
            placed_after_s=placing.placed_after_s,
            settled_after_s=placing.settled_after_s,
            frames_per_s=0.0,
            redis_calls_per_frame=0.0,
            top_commands={},
        )
        run.faults = faults(hosts, client, keys, workers, shape)
        return run


def report(runs: list[FleetRun], shapes: dict[str, Any]) -> None:
    print(
        f"{shapes['cameras']} cameras at {shapes['fps']:g} fps (64x64 H.264 replayed live), "
        f"simulated detector {shapes['service']} ms, lease TTL {LEASE_TTL_S:g} s"
    )
    for kind in ("single", "cluster"):
        rates: dict[int, list[float]] = {}
        for run in runs:
            if run.redis == kind and not run.faults:
                rates.setdefault(run.hosts, []).append(run.frames_per_s)
        if not rates:
            continue
        print(" single Redis" if kind == "single" else " Redis Cluster (3 masters)")
        one = statistics.median(rates[min(rates)]) / min(rates)
        for count, values in sorted(rates.items()):
            median = statistics.median(values)
            each = ", ".join(f"{v:.0f}" for v in values)
            ratio = median / (count * one)
            print(
                f"  {count} + {count} hosts: {median:7.1f} frames/s (runs {each}); "
                f"{ratio:.2f} x linear"
            )
    for run in runs:
        print(
            f" {run.redis} {run.hosts}+{run.hosts}: {run.cameras_placed} cameras placed in "
            f"{run.placed_after_s:.1f} s, settled in {run.settled_after_s:.1f} s; "
            f"{run.redis_calls_per_frame:.1f} Redis calls/frame "
            f"({', '.join(f'{c} {n:.2f}' for c, n in list(run.top_commands.items())[:5])})"
        )
        if run.cpu_ms_per_frame:
            spent = ", ".join(f"{r} {ms:.2f}" for r, ms in run.cpu_ms_per_frame.items())
            print(f"   CPU ms per frame: {spent}")
        if run.latency_ms:
            print(
                f"   XADD to published: p50 {run.latency_ms['p50']:.0f} ms, "
                f"p99 {run.latency_ms['p99']:.0f} ms"
            )
        for name, values in run.propagation.items():
            print(f"   {name}: median {statistics.median(values):.2f} s, max {max(values):.2f} s")
        for name, value in run.faults.items():
            print(f"   {name}: {json.dumps(value)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=1000)
    parser.add_argument("--hosts", default="1,2,4", help="decode (and detect) host counts")
    parser.add_argument("--fps", type=float, default=1.0, help="each camera's frame rate")
    parser.add_argument("--service", default="10,3", help="base_ms,per_frame_ms of a batch")
    parser.add_argument("--redis", default="single", help="single, cluster or single,cluster")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=1, help="runs per shape (median)")
    parser.add_argument("--changes", type=int, default=3, help="registry changes timed")
    parser.add_argument("--faults", action="store_true", help="also the fault run")
    parser.add_argument("--no-throughput", action="store_true", help="the fault run only")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--logs", metavar="DIR", help="keep the workers' logs there")
    args = parser.parse_args(argv)
    available, why = netns_available()
    if not available:
        parser.error(f"needs network namespaces: {why}")
    counts = sorted(int(n) for n in args.hosts.split(","))
    kinds = args.redis.split(",")
    if not set(kinds) <= {"single", "cluster"}:
        parser.error(f"--redis: single, cluster or both (single,cluster), not {args.redis!r}")
    base, per_frame = (float(v) for v in args.service.split(","))
    service = ServiceTime(base, per_frame)
    largest = counts[-1]
    decoders, detectors = host_names(largest)
    runs: list[FleetRun] = []
    if args.faults and largest < 2:
        parser.error("--faults needs two decode hosts at least")
    with TemporaryDirectory() as name, Hosts(["redis", *decoders, *detectors]) as hosts:
        folder = Path(name)
        clip = encode(CLIP, folder / CLIP.filename)
        hosts.enter("redis")  # Redis listens there; this driver talks to it as a neighbour

        def shape(count: int, kind: str, capacity: float) -> FleetShape:
            return FleetShape(args.cameras, count, capacity, args.fps, service, kind == "cluster")

        def measured(run: FleetRun) -> None:
            runs.append(run)
            print(json.dumps(asdict(run)), flush=True)

        try:
            for _ in range(0 if args.no_throughput else args.rounds):
                for kind in kinds:  # interleaved: drift on a shared machine hits every count
                    for count in counts:
                        capacity = math.ceil(args.cameras / largest)
                        changes = args.changes if count == largest else 0
                        fleet_shape = shape(count, kind, capacity)
                        measured(measure(hosts, fleet_shape, clip, folder, args.window, changes))
            if args.faults:
                spare = math.ceil(args.cameras / (largest - 1))  # room for a host's cameras
                for kind in kinds:
                    measured(measure_faults(hosts, shape(largest, kind, spare), clip, folder))
        finally:
            if args.logs:
                shutil.copytree(folder / "logs", args.logs, dirs_exist_ok=True)
    report(runs, {"cameras": args.cameras, "fps": args.fps, "service": args.service})
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
