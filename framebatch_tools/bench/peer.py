"""``framebatch bench --peer ultralytics``: framebatch against Ultralytics' multi-stream
predict on the same frames and model, in alternating rounds (this machine is noisy: medians and
the ratio of each round's pair are what count).

* framebatch: ``framebatch run CONFIG --until-done`` in a process of its own (its private
  redis-server included); frames/s = frames processed / wall time of the process, start-up
  and model load included, and over the processing window (first to last publish).
* the peer: ``YOLO(model).predict(source=<one line per camera>.streams, stream=True,
  stream_buffer=True)`` in a process of its own, the way its docs show multi-stream inference;
  the same wall time and the window from its first to its last result.

Each side's detections are counted, so a faster side that finds less would show.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import Config, ConfigError, load_config
from streams.rtsp_replay import serve_rtsp
from streams.sinks.jsonl import Options as JsonLinesOptions

log = logging.getLogger("framebatch.bench")

EXIT_OK, EXIT_BAD_INPUT = 0, 2

# Run in a fresh interpreter: the peer's multi-stream predict, its frames/s and detections.
PEER_SCRIPT = r"""
import json, sys, time
started = time.perf_counter()
from ultralytics import YOLO
streams, model_path, imgsz, conf, iou = sys.argv[1:6]
model = YOLO(model_path, task="detect")
frames = boxes = 0
first = last = None
for result in model.predict(source=streams, stream=True, stream_buffer=True, imgsz=int(imgsz),
                            conf=float(conf), iou=float(iou), verbose=False):
    last = time.perf_counter()
    first = first or last
    frames += 1
    boxes += len(result.boxes)
print(json.dumps({"frames": frames, "detections": boxes, "wall_s": time.perf_counter() - started,
                  "window_s": (last - first) if frames > 1 else 0.0}))
"""


# The peer on live cameras, as its docs show it: predict over a .streams file of RTSP URLs
# (stream_buffer off: it keeps each camera's newest frame); results counted for ``seconds``
# after the first.
PEER_LIVE_SCRIPT = r"""
import json, os, sys, time
from ultralytics import YOLO
streams, model_path, imgsz, conf, iou, seconds = sys.argv[1:7]
model = YOLO(model_path, task="detect")
frames = boxes = 0
first = now = None
for result in model.predict(source=streams, stream=True, imgsz=int(imgsz), conf=float(conf),
                            iou=float(iou), verbose=False):
    now = time.perf_counter()
    first = first or now
    if now - first >= float(seconds):
        break
    frames += 1
    boxes += len(result.boxes)
print(json.dumps({"frames": frames, "detections": boxes, "window_s": now - first}), flush=True)
os._exit(0)  # its camera reader threads would keep the process alive
"""
LIVE_STARTUP_S = 10.0  # framebatch's run: start-up, then the measured seconds


def run_measured(command: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run a side to its end: (process, wall seconds, CPU seconds of it and every process it
    waited for: decoders, redis-server, ONNX Runtime's threads)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall_s, cpu_s


def run_peer(config: Config, workdir: Path) -> dict[str, Any]:
    streams = workdir / "cameras.streams"
    streams.write_text("".join(f"{camera.url}\n" for camera in config.cameras))
    model = config.model
    command = [
        sys.executable,
        "-c",
        PEER_SCRIPT,
        str(streams),
        str(model.path),
        str(model.imgsz),
        str(model.conf),
        str(model.iou),
    ]
    proc, _, cpu_s = run_measured(command)
    if proc.returncode != 0:
        raise RuntimeError(f"the peer failed: {proc.stderr.strip().splitlines()[-1:]}")
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    figures["cpu_s"] = cpu_s
    figures["cpu_ms_per_frame"] = 1000 * cpu_s / figures["frames"]
    figures["fps_wall"] = figures["frames"] / figures["wall_s"]
    figures["fps_window"] = figures["frames"] / figures["window_s"]
    return figures


def run_framebatch(config: Config, workdir: Path) -> dict[str, Any]:
    """The configured run, with a JSON Lines sink added to count its detections."""
    lines = workdir / "detections.jsonl"
    sinks = [*config.sinks, JsonLinesOptions(kind="jsonl", path=lines)]
    config_path = workdir / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(config.model_copy(update={"sinks": sinks}).model_dump(mode="json"))
    )
    summary_path = workdir / "summary.json"
    command = [sys.executable, "-m", "pipeline.cli", "run", str(config_path), "--until-done"]
    command += ["--summary-json", str(summary_path)]
    proc, wall_s, cpu_s = run_measured(command)
    if proc.returncode != 0:
        raise RuntimeError(f"framebatch failed: {proc.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(summary_path.read_text())
    messages = [json.loads(line) for line in lines.read_text().splitlines()]
    return {
        "frames": summary["processed"],
        "dropped": sum(summary["dropped"].values()),
        "detections": sum(len(m["detections"]) for m in messages),
        "wall_s": wall_s,
        "window_s": summary["processing_s"],
        "cpu_s": cpu_s,
        "cpu_ms_per_frame": 1000 * cpu_s / summary["processed"],
        "fps_wall": summary["processed"] / wall_s,
        "fps_window": summary["processed"] / summary["processing_s"],
        "mean_batch_size": summary["mean_batch_size"],
    }


@contextmanager
def live_cameras(config: Config) -> Iterator[list[str]]:
    """Each camera's clip served as a live RTSP camera at its native rate (fresh servers for
    each side, so both meet the same cameras)."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(serve_rtsp(Path(camera.url), mount=f"/cam{index}"))
            for index, camera in enumerate(config.cameras, 1)
        ]


def run_peer_live(config: Config, workdir: Path, seconds: float) -> dict[str, Any]:
    with live_cameras(config) as urls:
        streams = workdir / "cameras.streams"
        streams.write_text("".join(f"{url}\n" for url in urls))
        model = config.model
        command = [sys.executable, "-c", PEER_LIVE_SCRIPT, str(streams), str(model.path)]
        command += [str(model.imgsz), str(model.conf), str(model.iou), str(seconds)]
        proc, _, cpu_s = run_measured(command)
    if proc.returncode != 0:
        raise RuntimeError(f"the peer failed: {proc.stderr.strip().splitlines()[-1:]}")
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    figures["fps_window"] = figures["frames"] / figures["window_s"]
    figures["latency_p99_s"] = None  # its API gives no capture time per result
    return figures


def run_framebatch_live(config: Config, workdir: Path, seconds: float) -> dict[str, Any]:
    """The daemon on the live cameras for start-up + ``seconds``, stopped by SIGINT (it
    finishes the batches in flight); its summary gives frames/s over its processing window,
    the p99 capture-to-publish latency and the frames dropped (stale: too old to be worth it)."""
    with live_cameras(config) as urls:
        cameras = [
            camera.model_copy(update={"url": url})
            for camera, url in zip(config.cameras, urls, strict=True)
        ]
        live = config.model_copy(update={"cameras": cameras})
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(live.model_dump(mode="json")))
        summary_path = workdir / "summary.json"
        command = [sys.executable, "-m", "pipeline.cli", "run", str(config_path)]
        daemon = subprocess.Popen(
            [*command, "--summary-json", str(summary_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(LIVE_STARTUP_S + seconds)
        daemon.send_signal(signal.SIGINT)
        _, stderr = daemon.communicate(timeout=120)
    if daemon.returncode != 0 or not summary_path.exists():
        raise RuntimeError(f"framebatch failed: {stderr.strip().splitlines()[-1:]}")
    summary = json.loads(summary_path.read_text())
    return {
        "frames": summary["processed"],
        "dropped": summary["dropped"],
        "window_s": summary["processing_s"],
        "fps_window": summary["processed"] / summary["processing_s"],
        "latency_p50_s": summary["latency_p50_s"],
        "latency_p99_s": summary["latency_p99_s"],
        "mean_batch_size": summary["mean_batch_size"],
    }


def run_bench_peer(args: argparse.Namespace) -> int:
    if args.peer != "ultralytics":
        print(f"framebatch bench: unknown peer {args.peer!r} (known: ultralytics)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        import ultralytics  # noqa: F401 - only to say what to install
    except ImportError:
        print(
            "framebatch bench --peer ultralytics needs the optional extra: "
            "pip install 'framebatch[ultralytics]'",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    config_path = Path(args.config)
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_INPUT
    rounds = []
    with tempfile.TemporaryDirectory(prefix="framebatch-bench-peer-") as tmp:
        for number in range(1, args.rounds + 1):
            pair = {}
            for side in (
                ("framebatch", "ultralytics") if number % 2 else ("ultralytics", "framebatch")
            ):
                log.info("round %d/%d: %s", number, args.rounds, side)
                workdir = Path(tmp) / f"{side}-{number}"
                workdir.mkdir()
                if args.live:
                    run = run_framebatch_live if side == "framebatch" else run_peer_live
                    pair[side] = run(config, workdir, args.live)
                elif side == "framebatch":
                    pair[side] = run_framebatch(config, workdir)
                else:
                    pair[side] = run_peer(config, workdir)
                log.info("  %s", json.dumps(pair[side]))
            pair["ratio_window"] = (
                pair["framebatch"]["fps_window"] / pair["ultralytics"]["fps_window"]
            )
            if not args.live:
                fps = (pair["framebatch"]["fps_wall"], pair["ultralytics"]["fps_wall"])
                pair["ratio_wall"] = fps[0] / fps[1]
            rounds.append(pair)
    ratios = ("ratio_window",) if args.live else ("ratio_wall", "ratio_window")
    figures = ("fps_window",) if args.live else ("fps_wall", "fps_window", "cpu_ms_per_frame")
    median = {key: statistics.median(r[key] for r in rounds) for key in ratios}
    for side in ("framebatch", "ultralytics"):
        for key in figures:
            median[f"{side}_{key}"] = statistics.median(r[side][key] for r in rounds)
    if args.live:
        p99 = statistics.median(r["framebatch"]["latency_p99_s"] for r in rounds)
        median["framebatch_latency_p99_s"] = p99
    report = {
        "command": shlex.join(sys.argv),
        "config": str(config_path),
        "live_seconds": args.live,
        "rounds": rounds,
        "median": median,
    }
    print(json.dumps(report["median"], indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2))
    return EXIT_OK
