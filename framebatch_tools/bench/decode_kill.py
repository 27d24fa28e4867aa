"""How soon a decode worker's cameras move when its daemon alone is SIGKILLed: ``python -m
framebatch_tools.bench.decode_kill [--cameras 8] [--ttl 3] [--rounds 5]``.

A private redis-server; two ``framebatch decode`` workers on ``--cameras`` looped copies of
the sample clip, paced at 5 frames/s as live cameras; once both decode their share, one
daemon is SIGKILLed alone (its decode processes outlive it a moment, as after a crash or the
OOM killer), and the seconds until the other holds the lease of every camera it decoded are
timed.  Each round starts both afresh.  Prints each round and the median: about one lease
tick where the decode processes leave the dead worker's last will, the TTL otherwise."""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from tempfile import TemporaryDirectory

import redis
import yaml

from streams.embedded_redis import EmbeddedRedis
from streams.keys import StreamKeys

CLIP = Path(__file__).resolve().parents[2] / "samples" / "clips" / "testsrc_640x360_15fps.mp4"
PREFIX = "decodekill"


def write_config(folder: Path, url: str, cameras: int, ttl_s: float) -> Path:
    model = folder / "unused.onnx"
    model.write_bytes(b"\x08")
    config = {
        "redis": {"url": url, "prefix": PREFIX, "lease_ttl_s": ttl_s},
        "model": {"path": str(model), "imgsz": 640, "rect": False},  # sizes given: never read
        "http": {"listen": None},
        "cameras": [
            {"id": f"c{n}", "url": str(CLIP), "loop": True, "realtime": True, "fps": 5}
            for n in range(cameras)
        ],
    }
    path = folder / "decode-kill.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_worker(config: Path, worker: str) -> subprocess.Popen:
    """A decode worker in a process group of its own (its decode processes with it), its log
    beside the config."""
    command = [sys.executable, "-m", "pipeline.cli", "decode", str(config), "--worker-id", worker]
    with (config.parent / f"{worker}.log").open("w") as log:
        return subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
        )


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.01)


def one_round(client: redis.Redis, config: Path, cameras: int, ttl_s: float, n: int) -> float:
    keys = StreamKeys(PREFIX)
    names = [f"kill{n}-a", f"kill{n}-b"]
    workers = {name: start_worker(config, name) for name in names}
    try:

        def owners() -> dict[str, str]:
            leases = [client.get(keys.decode_lease(f"c{i}")) for i in range(cameras)]
            return {f"c{i}": (held or b"").decode() for i, held in enumerate(leases)}

        def started() -> bool:
            heartbeats = client.zrange(keys.decode_workers(), 0, -1)
            return len(heartbeats) == 2 and all(owners().values())

        try:
            wait_for(started, 120, "both workers running, every camera decoded")
        except RuntimeError as error:
            logs = [(config.parent / f"{name}.log").read_text()[-2000:] for name in names]
            raise RuntimeError(f"{error}; their logs:\n" + "\n".join(logs)) from None
        # decoding, past the start; at a random phase of the survivor's lease tick (a fixed
        # pause put the kill just before it, round after round)
        time.sleep(random.Random(n).uniform(2.0, 3.0))
        victim = max(names, key=lambda name: list(owners().values()).count(name))
        survivor = next(name for name in names if name != victim)
        lost = [camera for camera, owner in owners().items() if owner == victim]
        os.kill(workers[victim].pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: all(owners()[camera] == survivor for camera in lost),
            ttl_s + 30,
            "the killed worker's cameras taken",
        )
        return time.monotonic() - killed
    finally:
        for worker in workers.values():
            with suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        client.flushall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=8)
    parser.add_argument("--ttl", type=float, default=3.0, help="redis.lease_ttl_s")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with (
        TemporaryDirectory() as folder,
        EmbeddedRedis() as server,
        redis.Redis.from_url(server.url) as client,
    ):
        config = write_config(Path(folder), server.url, args.cameras, args.ttl)
        moved = []
        for n in range(args.rounds):
            moved.append(one_round(client, config, args.cameras, args.ttl, n))
            print(f"round {n + 1}: the killed worker's cameras taken in {moved[-1]:.2f} s")
    print(
        f"median {statistics.median(moved):.2f} s over {args.rounds} rounds "
        f"(lease TTL {args.ttl:g} s, {args.cameras} cameras)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
