"""Many cameras on one box: ``python -m framebatch_tools.bench.cameras --cameras 32
[--max-fps 0.5] [--seconds 60] [--per-process N]``.

Issue #23's case: N cameras, each the 540p highway clip with ``realtime: true, loop: true``
sampled at ``--max-fps``, through ``framebatch run`` (real decoders, real Redis, the real
model on ONNX Runtime) for a measured window once every camera is open. Reported: seconds
from the daemon's start until the last camera opened, CPU of the decoder processes and of the
daemon (share of one core), PSS per decoder process and per camera, frames/s processed
against the demand (cameras x max_fps), p50/p99 capture-to-publish latency of the frames
published in the window, and the frames the window dropped. Targets on the project's 2-core
machine for 32 cameras at 0.5 fps: open <= 10 s, decoders <= 60 % of one core, >= 0.9x the
demand, p99 <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import redis
import yaml

from streams.embedded_redis import EmbeddedRedis
from streams.keys import StreamKeys
from streams.messages import DetectionMessage

SHARED = Path(__file__).resolve().parents[3] / "shared/assets"
CLIP = SHARED / "videos/highway_traffic_960x540_30fps.mp4"
MODEL = SHARED / "models/yolov8n_fp32_dynbatch.onnx"
PREFIX = "cams"
TICKS = os.sysconf("SC_CLK_TCK")
OPEN_TIMEOUT_S = 180.0
SETTLE_S = 10.0  # after the last camera opened: the model warm, the backlogs at their level


def camera_clip(gop: int | None, folder: Path) -> Path:
    """The clip as it is (a key frame every 3 s, B-frames), or re-encoded as a camera's
    sub-stream sends it: a key frame every ``gop`` frames, no B-frames."""
    if gop is None:
        return CLIP
    target = folder / f"highway_gop{gop}.mp4"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(CLIP), "-c:v", "libx264", "-g", str(gop)]
        + ["-keyint_min", str(gop), "-sc_threshold", "0", "-bf", "0", "-an", str(target)],
        check=True,
    )
    return target


def bench_config(args: argparse.Namespace, redis_url: str, clip: Path = CLIP) -> dict:
    cameras, max_fps = args.cameras, args.max_fps
    config: dict[str, Any] = {
        "redis": {"url": redis_url, "prefix": PREFIX},
        "model": {"path": str(MODEL), "threads": 2},
        "batching": {"max_batch_size": 8, "max_wait_ms": 50},
        "cameras": [
            {"id": f"cam{index:03d}", "url": str(clip), "realtime": True, "loop": True}
            | {"max_fps": max_fps}
            for index in range(cameras)
        ],
    }
    if args.per_process is not None:
        config["decoding"] = {"cameras_per_process": args.per_process}
    if args.transport is not None:
        config["transport"] = {"kind": args.transport}
    return config


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                todo.append(child)
    return found


def cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime


def pss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def decoder_pids(daemon: int) -> list[int]:
    """The daemon's descendants but multiprocessing's resource tracker."""
    pids = []
    for pid in descendants(daemon):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in command:
            pids.append(pid)
    return pids


def wait_for_open(client: redis.Redis, keys: StreamKeys, cameras: int, started: float) -> float:
    """Seconds from ``started`` (wall clock) until every camera's first ``opened`` event."""
    opened: dict[str, float] = {}
    deadline = time.monotonic() + OPEN_TIMEOUT_S
    while len(opened) < cameras:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(opened)} of {cameras} cameras opened")
        for _id, fields in client.xrange(keys.events()):
            if fields[b"event"] == b"opened":
                opened.setdefault(fields[b"camera"].decode(), float(fields[b"time"]))
        time.sleep(0.2)
    return max(opened.values()) - started


def published_in(
    client: redis.Redis, keys: StreamKeys, cameras: int, start: float, end: float
) -> list[DetectionMessage]:
    messages = []
    for index in range(cameras):
        key = keys.detections(f"cam{index:03d}")
        for _id, fields in client.xrange(key, int(start * 1000), int(end * 1000)):
            messages.append(DetectionMessage.from_fields(fields))
    return messages


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    with EmbeddedRedis() as server:
        url = server.url
        config = bench_config(args, url, camera_clip(args.gop, folder))
        config_path = folder / "cameras.yaml"
        config_path.write_text(yaml.safe_dump(config))
        command = [sys.executable, "-m", "pipeline.cli", "run", str(config_path), "--http", "off"]
        client = redis.Redis.from_url(url)
        keys = StreamKeys(PREFIX)
        started = time.time()
        daemon = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            open_s = wait_for_open(client, keys, args.cameras, started)
            time.sleep(SETTLE_S)
            decoders = decoder_pids(daemon.pid)
            before = {pid: cpu_ticks(pid) for pid in [daemon.pid, *decoders]}
            window_start = time.time()
            time.sleep(args.seconds)
            window_end = time.time()
            after = {pid: cpu_ticks(pid) for pid in before}
            pss = [pss_mb(pid) for pid in decoders]
            daemon_pss = pss_mb(daemon.pid)
        finally:
            daemon.send_signal(signal.SIGINT)
            try:
                _, stderr = daemon.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                daemon.kill()
                _, stderr = daemon.communicate()
        if daemon.returncode not in (0, 130):
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"framebatch run failed ({daemon.returncode}): {tail}")
        window = window_end - window_start
        published = published_in(client, keys, args.cameras, window_start, window_end)
    core = lambda pids: sum(after[p] - before[p] for p in pids) / TICKS / window  # noqa: E731
    latencies = sorted(m.latency_s for m in published)
    demand = args.cameras * args.max_fps
    frames_s = len(published) / window
    return {
        "cameras": args.cameras,
        "max_fps": args.max_fps,
        "per_process": args.per_process,
        "transport": args.transport or "auto",
        "gop": args.gop or "clip (90, B-frames)",
        "window_s": round(window, 1),
        "open_s": round(open_s, 1),
        "decoder_processes": len(decoders),
        "decoders_core": round(core(decoders), 3),
        "daemon_core": round(core([daemon.pid]), 3),
        "pss_mb_per_decoder_process": round(statistics.median(pss), 1) if pss else None,
        "pss_mb_decoders_per_camera": round(sum(pss) / args.cameras, 1),
        "pss_mb_daemon": round(daemon_pss, 1),
        "demand_fps": demand,
        "frames_s": round(frames_s, 2),
        "of_demand": round(frames_s / demand, 3),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
        "latency_p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3)
        if latencies
        else None,
        "mean_batch_size": round(statistics.mean(m.batch_size for m in published), 2)
        if published
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cameras", type=int, default=32, metavar="N")
    parser.add_argument("--max-fps", type=float, default=0.5, metavar="N", help="per camera")
    parser.add_argument("--seconds", type=float, default=60.0, metavar="S", help="window")
    parser.add_argument(
        "--per-process", type=int, default=None, metavar="N", help="cameras per decoder process"
    )
    parser.add_argument(
        "--gop", type=int, default=None, metavar="N", help="re-encode: a key frame every N"
    )
    parser.add_argument("--transport", default=None, help="transport.kind (default: auto)")
    parser.add_argument("--output", type=Path, default=None, metavar="PATH", help="JSON here")
    args = parser.parse_args()
    with TemporaryDirectory() as folder:
        result = measure(args, Path(folder))
    text = json.dumps(result, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
