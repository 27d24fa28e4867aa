"""What the decode lease's fence costs a decoder per frame: ``python -m
framebatch_tools.bench.fence [--frames 300] [--rounds 5]``.

A private redis-server; a frame entry as a decoder writes it (the letterboxed 640x384 frame's
raw pixels inline, 737 KB, and a shm reference, a few bytes), written ``--frames`` times each
way, alternated over ``--rounds``: unfenced (``framebatch run``: XADD and the progress HSET in
one pipeline) and fenced (``framebatch decode``: WATCH of the lease and the progress, a look at
both, then the same XADD and HSET in MULTI/EXEC).  Prints the median microseconds per frame of
each, as the decoder waits for it and as Redis spends it (its commandstats), and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import redis

from streams.embedded_redis import EmbeddedRedis
from streams.fence import DecodeLease, SessionFence
from streams.keys import StreamKeys
from streams.messages import FrameMessage, ShmRef

MAXLEN = 8
SHM = ShmRef("framebatch-bench-cam-r1-4242", 3, 7, "host-boot")


def message(seq: int, pixels: bytes, shm: ShmRef | None) -> FrameMessage:
    return FrameMessage(
        camera="cam",
        seq=seq,
        pts=seq / 15,
        width=960,
        height=540,
        scale=0.667,
        pad_x=0,
        pad_y=12,
        captured=time.time(),
        enqueued=time.time(),
        pixels=pixels,
        input_width=640,
        input_height=384,
        encoding="raw" if shm is None else "shm",
        shm=shm,
        session="s1",
    )


def plain(client: redis.Redis, keys: StreamKeys, fields: dict, progress: dict) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.xadd(keys.frames("cam"), fields, maxlen=MAXLEN, approximate=False)
    pipe.hset(keys.progress("cam"), mapping=progress)
    pipe.execute()


def per_frame_us(client: redis.Redis, write, frames: int, fields: dict) -> tuple[float, float]:
    """Microseconds per frame: the writer's wall time, and Redis's own time in commands."""
    client.config_resetstat()
    started = time.perf_counter()
    for seq in range(frames):
        write(fields, {"session": "s1", "frames": seq + 1, "redis_down": 0})
    wall = (time.perf_counter() - started) / frames * 1e6
    spent = sum(
        stats["usec"]
        for name, stats in client.info("commandstats").items()
        # EXEC's time holds its commands' (counted each on its own)
        if name not in ("cmdstat_config", "cmdstat_info", "cmdstat_exec")
    )
    return wall, spent / frames


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    keys = StreamKeys("bench")
    raw = np.random.default_rng(0).integers(0, 255, 640 * 384 * 3, dtype=np.uint8).tobytes()
    payloads = {"raw 737 KB": (raw, None), "shm reference": (b"", SHM)}
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        client.set(keys.decode_lease("cam"), "w")
        fence = SessionFence(client, keys, "cam", DecodeLease("w", 60_000), final=False)

        def fenced(fields: dict, progress: dict) -> None:
            fence.frame(client, fields, progress, MAXLEN)

        def unfenced(fields: dict, progress: dict) -> None:
            plain(client, keys, fields, progress)

        print(
            f"{'frame':>14} {'writer µs: unfenced':>20} {'fenced':>7} {'ratio':>6}"
            f" {'Redis µs: unfenced':>19} {'fenced':>7} {'ratio':>6}"
        )
        for name, (pixels, shm) in payloads.items():
            fields = message(0, pixels, shm).to_fields()
            runs: dict[str, list[tuple[float, float]]] = {"unfenced": [], "fenced": []}
            for _ in range(args.rounds):
                runs["unfenced"].append(per_frame_us(client, unfenced, args.frames, fields))
                runs["fenced"].append(per_frame_us(client, fenced, args.frames, fields))
            (wa, ra), (wb, rb) = (
                (statistics.median(w for w, _ in runs[k]), statistics.median(r for _, r in runs[k]))
                for k in ("unfenced", "fenced")
            )
            writer = f"{wa:20.0f} {wb:7.0f} {wb / wa:6.2f}"
            print(f"{name:>14} {writer} {ra:19.1f} {rb:7.1f} {rb / ra:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
