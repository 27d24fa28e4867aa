"""What the camera registry costs and how fast a change reaches the processes that follow it:
``python -m framebatch_tools.bench.registry [--cameras 1000] [--followers 8] [--changes 50]``.

A private redis-server; ``--cameras`` registered; ``--followers`` followers (each a process's
:class:`~pipeline.fleet.registry.RegistryFollower`, on its own connection and thread, looking
every ``--tick-s`` as the supervisors do); then ``--changes`` priority changes, one at a time,
each timed from the write until every follower has seen it.  Also: what one quiet look costs
(one GET), what a look after a change costs (the versions of every camera, then the entry
that changed), in milliseconds and Redis commands, as the followers run them.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import redis

from pipeline.config import CameraConfig
from pipeline.fleet.registry import CameraRegistry, RegistryFollower
from streams.embedded_redis import EmbeddedRedis
from streams.keys import StreamKeys


def camera(index: int, priority: int = 0) -> CameraConfig:
    return CameraConfig.model_validate(
        {
            "id": f"cam{index:05d}",
            "url": f"rtsp://10.0.{index // 250}.{index % 250}/sub",
            "priority": priority,
        }
    )


def commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


class Follower(threading.Thread):
    def __init__(self, url: str, keys: StreamKeys, tick_s: float, stop: threading.Event):
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.follower = RegistryFollower(CameraRegistry(self.client, keys))
        self.tick_s, self.stop = tick_s, stop
        self.seen: dict[tuple[str, int], float] = {}  # (camera, priority) -> when seen

    def run(self) -> None:
        while not self.stop.wait(self.tick_s):
            changes = self.follower.changes()
            now = time.perf_counter()
            for entry in changes.added + changes.changed:
                self.seen[(entry.config.id, entry.config.priority)] = now
                self.follower.applied(entry.config.id, entry.version)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=1000)
    parser.add_argument("--followers", type=int, default=8)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--tick-s", type=float, default=0.2)
    args = parser.parse_args()
    keys = StreamKeys("bench")
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        registry = CameraRegistry(client, keys)
        started = time.perf_counter()
        registry.seed(camera(i) for i in range(args.cameras))
        seed_s = time.perf_counter() - started

        looks = RegistryFollower(registry)
        started = time.perf_counter()
        for entry in looks.changes().added:  # the first look: every camera
            looks.applied(entry.config.id, entry.version)
        first_ms = (time.perf_counter() - started) * 1000
        looks.changes()  # settled: nothing left to apply
        quiet = [timed(looks.changes) for _ in range(200)]
        entry = registry.get(camera(0).id)
        registry.change(camera(0, priority=1), entry.version)
        before, started = commands(client), time.perf_counter()
        (changed,) = looks.changes().changed
        change_ms = (time.perf_counter() - started) * 1000
        change_commands = commands(client) - before - 1  # less INFO's own
        looks.applied(changed.config.id, changed.version)

        stop = threading.Event()
        followers = [Follower(server.url, keys, args.tick_s, stop) for _ in range(args.followers)]
        for follower in followers:
            follower.start()
        time.sleep(args.tick_s * 3)  # every follower has had its first look
        delays = []
        for n in range(args.changes):
            index = (n * 7919) % args.cameras
            current = registry.get(camera(index).id)
            priority = (current.config.priority + 1) % 10
            written = time.perf_counter()
            registry.change(camera(index, priority=priority), current.version)
            key = (camera(index).id, priority)
            deadline = written + 10
            while not all(key in f.seen for f in followers) and time.perf_counter() < deadline:
                time.sleep(0.002)
            delays.append(max(f.seen.get(key, float("inf")) for f in followers) - written)
            for follower in followers:
                follower.seen.pop(key, None)
        stop.set()
        for follower in followers:
            follower.join()
    delays.sort()
    p99 = delays[min(len(delays) - 1, round(0.99 * (len(delays) - 1)))]
    each_ms = seed_s / args.cameras * 1000
    print(f"{args.cameras} cameras seeded in {seed_s:.2f} s ({each_ms:.2f} ms each)")
    quiet_ms = statistics.median(quiet)
    print(f"a follower's first look: {first_ms:.1f} ms; a quiet look: {quiet_ms:.3f} ms (1 GET)")
    print(f"a look after one change: {change_ms:.2f} ms, {change_commands} commands")
    print(
        f"a change seen by all {args.followers} followers (tick {args.tick_s:g} s), "
        f"{args.changes} changes: p50 {statistics.median(delays) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {delays[-1] * 1000:.0f} ms"
    )
    return 0


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


if __name__ == "__main__":
    raise SystemExit(main())
