"""``framebatch bench-transport``: frames/s through Redis for each frame transport, side by side.

N producer processes (the decoders' part) each push letterboxed 640x640 frames of a real clip
through a transport's encoder and ``XADD`` them, waiting for room like a file job does; the
reader (the batcher's part) ``XREADGROUP``s every stream, gets each frame's pixels out with
the batcher's ``FrameDecoder``, then ``XACK`` + ``XDEL``s them in one round trip.  A trial is
bounded in frames and seconds; the machine is noisy, so transports alternate over rounds and
figures are medians.  No model runs: this measures what a transport costs, nothing else.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis

from detectors.preprocess import Letterbox
from streams.decode_worker import ProcessFlag, wait_until_read
from streams.embedded_redis import EmbeddedRedis, RedisServerError, free_tcp_port
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import EndOfStream, FrameMessage, message_kind
from streams.sources import VideoSource
from streams.transport import (
    TRANSPORT_KINDS,
    FrameDecoder,
    TransportLost,
    TransportSpec,
    make_encoder,
)

log = logging.getLogger("framebatch.bench_transport")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
TARGET_SHM_FPS = 2000.0
BACKLOG = 64  # frames per stream, as redis.frames_maxlen's default
READ_COUNT = 8  # entries per stream and XREADGROUP, like a batch of 8
POOL_FRAMES = 16  # distinct frames each producer cycles through
ROOM_POLL_S = 0.001
_REPO = Path(__file__).resolve().parents[2]
DEFAULT_CLIP = _REPO.parent / "shared/assets/videos/highway_traffic_960x540_30fps.mp4"
FALLBACK_CLIP = _REPO / "samples/clips/testsrc_640x360_15fps.mp4"  # when the assets are absent


def letterboxed_pool(clip: Path, frames: int = POOL_FRAMES) -> list[np.ndarray]:
    """The first ``frames`` frames of a clip, letterboxed to 640x640 as the decoders do."""
    letterbox, pool = Letterbox(640, 640), []
    with VideoSource("bench", str(clip)) as source:
        for decoded in source.frames():
            pool.append(letterbox(decoded.image).pixels)
            if len(pool) == frames:
                break
    if not pool:
        raise ValueError(f"{clip} has no frames")
    return pool


@dataclass(frozen=True)
class Trial:
    """What one producer does in a trial."""

    redis_url: str
    prefix: str
    camera: str
    transport: TransportSpec
    clip: str
    max_frames: int
    seconds: float


def produce(trial: Trial, ready: Any, go: ProcessFlag) -> None:
    """Producer process: encode + XADD frames with backpressure, then an end entry; with shm,
    keep the ring until the reader has taken every frame."""
    client = redis.Redis.from_url(trial.redis_url)
    key = StreamKeys(trial.prefix).frames(trial.camera)
    pool = letterboxed_pool(Path(trial.clip))
    encoder = make_encoder(
        trial.transport,
        redis_url=trial.redis_url,
        prefix=trial.prefix,
        camera=trial.camera,
        max_backlog=BACKLOG,
        pid=os.getpid(),
    )
    try:
        ready.release()
        go.wait()
        deadline = time.monotonic() + trial.seconds
        sent = room = 0
        while sent < trial.max_frames and time.monotonic() < deadline:
            while room <= 0:  # XLEN = backlog: the reader deletes what it acknowledged
                room = BACKLOG - client.xlen(key)
                if room <= 0:
                    time.sleep(ROOM_POLL_S)
            encoded = encoder.encode(pool[sent % len(pool)])
            now = time.time()
            message = FrameMessage(
                camera=trial.camera,
                seq=sent,
                pts=None,
                width=640,
                height=640,
                scale=1.0,
                pad_x=0,
                pad_y=0,
                captured=now,
                enqueued=now,
                pixels=encoded.pixels,
                encoding=encoded.encoding,
                shm=encoded.shm,
            )
            client.xadd(key, message.to_fields())
            sent += 1
            room -= 1
        client.xadd(key, EndOfStream(trial.camera, sent, "eof").to_fields())
        if encoder.holds_frames:
            wait_until_read(client, key, None, idle_s=5.0)
    finally:
        encoder.close()
        client.close()


def consume(
    client: redis.Redis, keys: list[str], decoder: FrameDecoder, deadline: float
) -> tuple[int, int, float, Counter[str]]:
    """The batcher's side: read, get the pixels, acknowledge and delete, until every producer
    ended.  Returns (frames read back, entry bytes seen, perf_counter of the last frame, lost)."""
    read_ids = {key: ">" for key in keys}
    frames = entry_bytes = ended = 0
    last = time.perf_counter()
    lost: Counter[str] = Counter()
    while ended < len(keys) and time.monotonic() < deadline:
        reply = client.xreadgroup(FRAMES_GROUP, "bench", read_ids, count=READ_COUNT, block=100)
        if not reply:
            continue
        pipe = client.pipeline(transaction=False)
        for key, entries in reply:
            for _entry_id, fields in entries:
                if message_kind(fields) == "end":
                    ended += 1
                    continue
                message = FrameMessage.from_fields(fields)
                entry_bytes += sum(len(k) + len(v) for k, v in fields.items())
                try:
                    decoder.image(message)
                except TransportLost as exc:
                    lost[exc.cause] += 1
                    continue
                frames += 1
            ids = [entry_id for entry_id, _ in entries]
            pipe.xack(key, FRAMES_GROUP, *ids)
            pipe.xdel(key, *ids)
        pipe.execute()
        last = time.perf_counter()
    return frames, entry_bytes, last, lost


def run_trial(
    redis_url: str, kind: str, args: argparse.Namespace, round_index: int
) -> dict[str, Any]:
    """One transport, ``args.producers`` producers, bounded by frames and seconds."""
    prefix = f"bench-transport-{kind}-{round_index}"
    keys = [StreamKeys(prefix).frames(f"cam{i}") for i in range(args.producers)]
    client = redis.Redis.from_url(redis_url)
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), ProcessFlag()
    spec = TransportSpec(kind, jpeg_quality=args.jpeg_quality)
    producers = []
    decoder = FrameDecoder()
    try:
        for key in keys:
            client.delete(key)
            client.xgroup_create(key, FRAMES_GROUP, id="0", mkstream=True)
        for i in range(args.producers):
            trial = Trial(
                redis_url, prefix, f"cam{i}", spec, str(args.clip), args.frames, args.seconds
            )
            process = context.Process(target=produce, args=(trial, ready, go), daemon=True)
            process.start()
            producers.append(process)
        for _ in producers:  # setup (imports, clip decode, ring) is not timed
            if not ready.acquire(timeout=60):
                raise RuntimeError("a producer did not start within 60 s")
        started = time.perf_counter()
        go.set()
        frames, entry_bytes, last, lost = consume(
            client, keys, decoder, time.monotonic() + args.seconds + 30
        )
    finally:
        go.set()
        for process in producers:
            process.join(15)
            if process.is_alive():
                process.kill()
                process.join()
        decoder.close()
        for key in keys:
            client.delete(key)
        client.close()
    elapsed = last - started
    return {
        "transport": kind,
        "round": round_index,
        "frames": frames,
        "seconds": elapsed,
        "frames_per_s": frames / elapsed if elapsed > 0 else 0.0,
        "entry_bytes_mean": entry_bytes / frames if frames else 0.0,
        "lost": dict(lost),
    }


def summarise(trials: list[dict[str, Any]], kinds: list[str]) -> dict[str, dict[str, Any]]:
    summary = {}
    for kind in kinds:
        mine = [t for t in trials if t["transport"] == kind]
        summary[kind] = {
            "frames_per_s_median": statistics.median(t["frames_per_s"] for t in mine),
            "frames_per_s_rounds": [round(t["frames_per_s"], 1) for t in mine],
            "entry_bytes_mean": statistics.median(t["entry_bytes_mean"] for t in mine),
            "frames_per_round": [t["frames"] for t in mine],
            "lost": sum((Counter(t["lost"]) for t in mine), Counter()),
        }
    return summary


def format_table(summary: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"frame transports: {args.producers} producer(s) x <= {args.frames} frames or "
        f"{args.seconds:g} s, 640x640x3, {args.rounds} alternating round(s), medians",
        f"{'transport':<10} {'frames/s':>9} {'entry size':>11} {'lost':>5}  rounds",
    ]
    for kind, figures in summary.items():
        size = figures["entry_bytes_mean"]
        size_text = f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size:.0f} B"
        lines.append(
            f"{kind:<10} {figures['frames_per_s_median']:>9.0f} {size_text:>11} "
            f"{sum(figures['lost'].values()):>5}  {figures['frames_per_s_rounds']}"
        )
    raw = summary.get("raw", {}).get("frames_per_s_median")
    if raw:
        ratios = ", ".join(
            f"{kind} {f['frames_per_s_median'] / raw:.1f}x" for kind, f in summary.items()
        )
        lines.append(f"vs raw: {ratios}")
    return "\n".join(lines)


def machine_info(redis_url: str) -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    models = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    client = redis.Redis.from_url(redis_url)
    try:
        server = client.info("server")
    finally:
        client.close()
    return {
        "platform": platform.platform(),
        "cpu_model": models[0] if models else platform.processor(),
        "cpu_count": os.cpu_count(),
        "load_before": os.getloadavg(),
        "python": platform.python_version(),
        "redis_server": server.get("redis_version"),
        "redis_py": redis.__version__,
        "redis_url_kind": redis_url.split(":", 1)[0],
    }


def run_bench_transport(args: argparse.Namespace) -> int:
    """The ``framebatch bench-transport`` command: a table on stdout, JSON to ``--output``."""
    kinds = [kind.strip() for kind in args.transports.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in TRANSPORT_KINDS]
    if args.clip is None:
        args.clip = DEFAULT_CLIP if DEFAULT_CLIP.is_file() else FALLBACK_CLIP
    problems = []
    if unknown or not kinds:
        problems.append(f"--transports: unknown {unknown} (known: {', '.join(TRANSPORT_KINDS)})")
    if not Path(args.clip).is_file():
        problems.append(f"--clip: no file {args.clip}")
    if min(args.producers, args.frames, args.rounds) < 1 or args.seconds <= 0:
        problems.append("--producers, --frames, --rounds and --seconds must be > 0")
    if args.output and not Path(args.output).absolute().parent.is_dir():
        problems.append(f"--output: no folder {Path(args.output).absolute().parent}")
    if problems:
        for problem in problems:
            print(f"framebatch bench-transport: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        server = (
            None if args.redis_url else EmbeddedRedis(port=free_tcp_port() if args.tcp else None)
        )
        redis_url = args.redis_url or server.start().url
    except RedisServerError as exc:
        print(f"framebatch bench-transport: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        machine = machine_info(redis_url)
        trials = []
        for round_index in range(args.rounds):
            order = kinds if round_index % 2 == 0 else kinds[::-1]
            for kind in order:
                trial = run_trial(redis_url, kind, args, round_index)
                log.info(
                    "round %d %s: %.0f frames/s (%d frames)",
                    round_index + 1,
                    kind,
                    trial["frames_per_s"],
                    trial["frames"],
                )
                trials.append(trial)
    finally:
        if server is not None:
            server.stop()
    summary = summarise(trials, kinds)
    print(format_table(summary, args))
    data = {
        "command": "framebatch " + shlex.join(sys.argv[1:]),
        "settings": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "handler"
        },
        "machine": machine,
        "summary": summary,
        "trials": trials,
        "target_shm_frames_per_s": TARGET_SHM_FPS,
    }
    if args.output:
        Path(args.output).write_text(json.dumps(data, indent=2))
    lost = sum(sum(f["lost"].values()) for f in summary.values())
    return EXIT_FAILED if lost else EXIT_OK
