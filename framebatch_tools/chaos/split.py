"""``framebatch chaos --topology split``: the faults of a fleet, on the split roles across hosts.

Cameras from the registry (the fleet benchmark's tiny generated clip replayed as live cameras)
over two ``framebatch decode`` and two ``framebatch detect`` workers (the simulated detector of
``bench.scale``: what is under test is the hand-overs, not the model), each on a host of its
own (network namespaces, ``framebatch_tools.netns``), sharing a Redis or a three-master Redis
Cluster on a host of its own, every node persisting to an append-only file fsynced on each
write.  Seeded faults, in rounds of every kind in a shuffled order:

* ``decode_kill`` / ``detect_kill``: a worker SIGKILLed, then started again under the same id
  (a pod's container restarted: it waits out its old heartbeat);
* ``host_cut``: a worker host's cable pulled for 5 s (past the lease TTL) and put back;
* ``redis_restart``: redis-server (on a cluster, one master) SIGKILLed and started again from
  its append-only file;
* ``registry_change``: a camera removed through the registry (drained, retired) and added back.

After each fault: nothing of a killed worker left running, and the time from the fault's start
until every camera has a detection of a frame captured after it (a killed or cut worker's
cameras: once another worker took them over; compare with ``lease_ttl_s`` + 2 s).  At the end
the decoders stop, every frames stream is read to its end, the detectors stop, and every
camera is audited from Redis (its data kept through the restarts): every frame of every
session detected or dropped with a cause, duplicates removed by frame id.

Needs root and iproute2 (``ip netns``), ``redis-server`` and ffmpeg.  The harness moves itself
onto the Redis host's network (a cluster announces that address): run it as a process.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path

import redis

from framebatch_tools.audit import audit
from framebatch_tools.bench.fleet import (
    CLIP,
    PREFIX,
    FleetShape,
    Workers,
    camera_entry,
    camera_ids,
    sessions,
    unread,
    write_config,
)
from framebatch_tools.bench.scale import ServiceTime
from framebatch_tools.chaos.plan import SPLIT_FAULTS, FaultPlan
from framebatch_tools.chaos.processes import alive, cmdline, descendants, wait_until
from framebatch_tools.chaos.report import ChaosReport, FaultResult
from framebatch_tools.local_cluster import LocalRedisCluster
from framebatch_tools.netns import Hosts
from pipeline.config import CameraConfig
from pipeline.fleet.registry import CameraRegistry, RegistryConflict
from samples.generate import encode
from streams.embedded_redis import EmbeddedRedis
from streams.keys import StreamKeys
from streams.redis_connect import connect

DECODERS = ("dec1", "dec2")
DETECTORS = ("det1", "det2")
REDIS_PORT = 6379
CUT_S = 5.0
SERVICE = ServiceTime(10.0, 3.0)  # a batch of b: 10 + 3 b ms, as a GPU per worker would
RECOVERY_TIMEOUT_S = 90.0
START_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 120.0
OPEN_TO_HOSTS = ("--protected-mode", "no")  # the switch is private to the run


class PersistentRedis:
    """The run's Redis on the ``redis`` host: one server or a three-master cluster, every
    node with its append-only file; ``restart`` crashes one and starts it again."""

    def __init__(self, host: str, cluster: bool, data: Path):
        self._host, self.cluster, self._data = host, cluster, data
        self._server: EmbeddedRedis | None = None
        self._nodes: LocalRedisCluster | None = None
        self.url = ""

    def __enter__(self) -> PersistentRedis:
        self._data.mkdir(parents=True, exist_ok=True)
        if self.cluster:
            self._nodes = LocalRedisCluster(
                host=self._host, extra_args=OPEN_TO_HOSTS, aof_dir=self._data
            ).__enter__()
            self.url = self._nodes.url
        else:
            self._server = self._single().start()
            self.url = self._server.url
        return self

    def _single(self) -> EmbeddedRedis:
        return EmbeddedRedis(
            port=REDIS_PORT, bind=self._host, aof_dir=self._data, extra_args=OPEN_TO_HOSTS
        )

    def restart(self, rng: random.Random) -> str:
        """Crash the server (a cluster: a master drawn by ``rng``), wait a moment, start it
        again with its data; which one."""
        if self._nodes is not None:
            index = rng.randrange(len(self._nodes.ports))
            self._nodes.crash_node(index)
            time.sleep(rng.uniform(0.1, 2.0))
            self._nodes.start_node(index)
            return f"master {index}"
        assert self._server is not None
        self._server.crash()
        time.sleep(rng.uniform(0.1, 2.0))
        self._server = self._single().start()
        return "redis-server"

    def __exit__(self, *exc_info: object) -> None:
        if self._nodes is not None:
            self._nodes.__exit__(*exc_info)
        if self._server is not None:
            self._server.stop()


class SplitChaos:
    """One seeded run: ``run()`` returns the report; every process it starts, it stops."""

    def __init__(
        self,
        *,
        hosts: Hosts,
        cameras: int,
        fps: float,
        cluster: bool,
        plan: FaultPlan,
        workdir: Path,
    ):
        self._hosts = hosts
        self._cameras = camera_ids(cameras)
        self._fps = fps
        self._cluster = cluster
        self._plan = plan
        self._rng = plan.rng()
        self._workdir = workdir
        self._exit_codes: list[int] = []
        self._started = time.monotonic()

    @contextmanager
    def _fleet(self) -> Iterator[tuple[PersistentRedis, redis.Redis, Workers, Path]]:
        """Redis, the registered cameras and the workers, every camera decoded."""
        with ExitStack() as stack:
            address = self._hosts.addresses["redis"]
            server = stack.enter_context(
                PersistentRedis(address, self._cluster, self._workdir / "aof")
            )
            client = connect(server.url, cluster=self._cluster, reconnect_timeout_s=60)
            stack.callback(client.close)
            clip = encode(CLIP, self._workdir / CLIP.filename)
            count = len(self._cameras)  # a worker can take them all: one is enough
            shape = FleetShape(count, 2, count, self._fps, SERVICE, self._cluster)
            config = write_config(self._workdir / "split.yaml", server.url, shape, clip)
            CameraRegistry(client, StreamKeys(PREFIX)).seed(
                CameraConfig(**camera_entry(c, clip, self._fps)) for c in self._cameras
            )
            logs = self._workdir / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            workers = Workers(self._hosts, config, logs)
            stack.callback(self._stop, workers, DETECTORS)  # last: they read what is left
            stack.callback(self._stop, workers, DECODERS)
            for host in DETECTORS:
                workers.detect(host, SERVICE)
            for host in DECODERS:
                workers.decode(host, len(self._cameras))
            yield server, client, workers, clip

    def _stop(self, workers: Workers, hosts: tuple[str, ...]) -> None:
        running = [h for h in hosts if h in workers.processes]
        workers.stop(running)
        self._exit_codes += [workers.processes.pop(h).returncode for h in running]

    def _flowing_since(
        self,
        client: redis.Redis,
        keys: StreamKeys,
        since: float,
        timeout_s: float = RECOVERY_TIMEOUT_S,
    ) -> float | None:
        """Seconds from ``since`` (epoch) until every camera has a detection of a frame
        captured after it; None if that did not happen within ``timeout_s``."""

        def flowing() -> bool:
            pipe = client.pipeline(transaction=False)
            for camera in self._cameras:
                pipe.xrevrange(keys.detections(camera), count=1)
            try:
                newest = pipe.execute()
            except redis.RedisError:
                return False  # Redis coming back
            return all(e and float(e[0][1][b"captured"]) > since for e in newest)

        if not wait_until(flowing, timeout_s):
            return None
        return time.time() - since

    def _restart_worker(self, workers: Workers, host: str) -> None:
        if host in DECODERS:
            workers.decode(host, len(self._cameras))
        else:
            workers.detect(host, SERVICE)

    def _inject(
        self, kind: str, server: PersistentRedis, client: redis.Redis, workers: Workers, clip: Path
    ) -> tuple[str, list[str], float | None]:
        """Apply one fault: what it hit, what a killed worker left running, and the recovery
        when it came while the fault lasted (a host cut: its cameras taken over meanwhile)."""
        leftovers: list[str] = []
        since = time.time()
        if kind in ("decode_kill", "detect_kill"):
            host = self._rng.choice(DECODERS if kind == "decode_kill" else DETECTORS)
            process = workers.processes[host]
            tree = descendants(process.pid)
            process.kill()
            self._exit_codes.append(process.wait())
            if not wait_until(lambda: not alive(tree), 15):
                leftovers += [f"process {pid}: {cmdline(pid)}" for pid in alive(tree)]
            time.sleep(self._rng.uniform(0.5, 2.0))
            self._restart_worker(workers, host)
            return host, leftovers, None
        if kind == "host_cut":
            host = self._rng.choice(DECODERS + DETECTORS)
            self._hosts.link(host, up=False)
            during = self._flowing_since(client, StreamKeys(PREFIX), since, CUT_S)
            time.sleep(max(0.0, since + CUT_S - time.time()))
            self._hosts.link(host, up=True)
            return host, leftovers, during
        if kind == "redis_restart":
            return server.restart(self._rng), leftovers, None
        if kind == "registry_change":
            camera = self._rng.choice(self._cameras)
            registry = CameraRegistry(client, StreamKeys(PREFIX))
            try:
                registry.remove(camera)
                if not wait_until(lambda: registry.get(camera) is None, RECOVERY_TIMEOUT_S):
                    return camera, [f"camera {camera}: removed, never retired"], None
                registry.add(CameraConfig(**camera_entry(camera, clip, self._fps)))
            except RegistryConflict as refused:
                leftovers.append(f"camera {camera}: {refused}")
            return camera, leftovers, None
        raise ValueError(f"unknown fault {kind!r} (known: {', '.join(SPLIT_FAULTS)})")

    def run(self) -> ChaosReport:
        self._workdir.mkdir(parents=True, exist_ok=True)
        keys = StreamKeys(PREFIX)
        results: list[FaultResult] = []
        with self._fleet() as (server, client, workers, clip):

            def placed() -> bool:
                workers.check_alive()
                return len(sessions(client, keys, self._cameras)) == len(self._cameras)

            if not wait_until(placed, START_TIMEOUT_S):
                raise RuntimeError(f"not every camera decoded within {START_TIMEOUT_S:.0f} s")
            if self._flowing_since(client, keys, time.time()) is None:
                raise RuntimeError("no camera's frames detected")
            for index, kind in enumerate(self._plan.schedule(self._rng)):
                time.sleep(self._rng.uniform(*self._plan.interval_s))
                at, since = time.monotonic() - self._started, time.time()
                hit, leftovers, recovered = self._inject(kind, server, client, workers, clip)
                if recovered is None:  # from the fault's start
                    recovered = self._flowing_since(client, keys, since)
                results.append(FaultResult(index, f"{kind}", round(at, 1), recovered, leftovers))
                print(
                    f"{time.strftime('%H:%M:%S')} fault {index} {kind} ({hit}): recovered in "
                    f"{'-' if recovered is None else f'{recovered:.1f} s'}"
                    f"{f', LEFT {leftovers}' if leftovers else ''}",
                    flush=True,
                )
            self._stop(workers, DECODERS)
            in_progress = sessions(client, keys, self._cameras)
            if in_progress:  # each decoder stopped wrote its end, or its successor did
                raise RuntimeError(f"sessions never ended: {sorted(in_progress)}")
            if not wait_until(lambda: not unread(client, keys, self._cameras), DRAIN_TIMEOUT_S):
                left = [camera for camera, _groups in unread(client, keys, self._cameras)]
                raise RuntimeError(f"frames streams not read to their end: {left}")
            self._stop(workers, DETECTORS)
            reports = audit(client, keys, self._cameras)
        cameras = [{**asdict(r), "dropped": dict(r.dropped)} for r in reports]
        return ChaosReport(
            self._plan.seed, results, cameras, self._exit_codes, time.monotonic() - self._started
        )


def run_split(
    *,
    cameras: int,
    fps: float,
    cluster: bool,
    plan: FaultPlan,
    workdir: Path,
) -> ChaosReport:
    """The hosts made, the harness on the Redis host's network, one seeded run."""
    with Hosts(["redis", *DECODERS, *DETECTORS]) as hosts:
        hosts.enter("redis")
        return SplitChaos(
            hosts=hosts,
            cameras=cameras,
            fps=fps,
            cluster=cluster,
            plan=plan,
            workdir=workdir,
        ).run()
