"""Detector workers scaling out: ``python -m framebatch_tools.bench.scale [--workers 1,2,4]
[--redis single,cluster]``.

Frames/s through 1, 2 and 4 ``framebatch detect`` workers (real processes, real Redis, real
leases, reader, batching, publisher and acknowledgements) sharing 16 cameras. The detector is
simulated: a batch of b frames takes ``base + per_frame x b`` milliseconds of sleep, the same
on every worker, as a GPU each would give; so the figure is how well the workers share the
work, not this 2-core machine's CPU (labelled so). The cameras are synthetic frame sources
fed through the real decode worker (backpressure: each stream holds a few frames waiting, so
no worker ever waits for input). Counted: detection messages published during a fixed window
once every worker holds its cameras. Target: n workers give >= 0.9 x n x one worker.
``--redis cluster`` runs the same against a three-master Redis Cluster on loopback (per-camera
transactions, polled reads), beside a single Redis on a loopback TCP port for comparison.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
import redis
import yaml

from detectors.base import BatchOutput, ModelInfo
from detectors.detector import Detector
from detectors.postprocess import InputDetections, Thresholds
from detectors.preprocess import Letterbox
from framebatch_tools.local_cluster import LocalRedisCluster
from pipeline.config import Config, load_config
from streams.decode_worker import DecoderSpec, DecodeWorker
from streams.embedded_redis import EmbeddedRedis, free_tcp_port
from streams.keys import StreamKeys
from streams.redis_connect import connect
from streams.sampling import DecodeGate
from streams.sources import DecodedFrame, VideoSource

IMGSZ = 64  # small frames: Redis and the reader move them, the simulated model ignores them
CAMERAS = 16
PREFIX = "scale"
WORKER_MODULE = "framebatch_tools.bench.scale"  # this module, run as a worker process


@dataclass(frozen=True)
class ServiceTime:
    """The simulated model: a batch of ``b`` takes ``base_ms + per_frame_ms * b``."""

    base_ms: float = 20.0
    per_frame_ms: float = 10.0

    def seconds(self, batch: int) -> float:
        return (self.base_ms + self.per_frame_ms * batch) / 1000


class SimulatedBackend:
    """Sleeps for the service time of each batch and finds nothing (not CPU bound)."""

    def __init__(self, service: ServiceTime, max_batch: int):
        self.info = ModelInfo("simulated", "simulated", IMGSZ, IMGSZ, ("thing",), 1, max_batch)
        self._service = service

    def prepare(self, images: Sequence[np.ndarray]) -> int:
        return len(images)

    def infer(self, prepared: int) -> BatchOutput:
        time.sleep(self._service.seconds(prepared))
        empty = np.zeros((0, 4), np.float32)
        nothing = InputDetections(empty, np.zeros(0, np.float32), np.zeros(0, np.int64))
        return BatchOutput(found=(nothing,) * prepared)

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        pass

    def close(self) -> None:
        pass


class SimulatedCamera(VideoSource):
    """``frames`` synthetic frames, as fast as they are taken (backpressure paces them)."""

    def __init__(self, spec: DecoderSpec, frames: int):
        super().__init__(spec.camera, spec.url)
        self._count = frames
        self._image = np.full((IMGSZ, IMGSZ, 3), 114, np.uint8)

    def open(self) -> SimulatedCamera:
        return self

    def frames(self, skip: DecodeGate | None = None) -> Iterator[DecodedFrame]:
        """Every frame a key frame: nothing to skip."""
        for index in range(self._count):
            yield DecodedFrame(self._image, index / 30)


def write_config(path: Path, redis_url: str, max_batch: int, cluster: bool) -> Path:
    model = path.parent / "simulated.onnx"  # never opened: the detector is simulated
    model.write_bytes(b"\x08")
    config = {
        "redis": {
            "url": redis_url,
            "prefix": PREFIX,
            "frames_maxlen": 2 * max_batch,
            "cluster": cluster,
        },
        "model": {"path": str(model), "imgsz": IMGSZ, "rect": False},  # never read
        "batching": {"max_batch_size": max_batch, "max_wait_ms": 5},
        "http": {"listen": None},
        "cameras": [{"id": f"cam{i:02d}", "url": "simulated.mp4"} for i in range(CAMERAS)],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def run_worker(config_path: str, worker_id: str, service: ServiceTime) -> int:
    """One ``framebatch detect`` worker with the simulated model, until SIGTERM."""
    from pipeline.daemon import Pipeline

    # as `framebatch detect` logs: lease changes at INFO, with times (the fleet's logs)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    def simulated(config: Config, device: str) -> Detector:
        backend = SimulatedBackend(service, config.batching.max_batch_size)
        return Detector(backend, thresholds=Thresholds())

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    Pipeline.init_detect(
        load_config(config_path),
        worker_id=worker_id,
        detector_factory=simulated,
        stop=stop,
        serve_http=False,
    ).run()
    return 0


def feed_cameras(
    redis_url: str, stop: threading.Event, frames: int, cluster: bool
) -> list[threading.Thread]:
    """A decode worker thread per camera, on synthetic frames."""
    threads = []
    for index in range(CAMERAS):
        spec = DecoderSpec(
            camera=f"cam{index:02d}",
            url="simulated.mp4",
            live=False,
            realtime=False,
            loop=False,
            backpressure=True,
            max_backlog=16,
        )
        worker = DecodeWorker(
            spec=spec,
            redis_client=connect(redis_url, cluster=cluster),
            keys=StreamKeys(PREFIX),
            prepare=Letterbox(IMGSZ, IMGSZ),
            open_source=lambda spec: SimulatedCamera(spec, frames),
        )
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def detections(client: redis.Redis) -> int:
    keys = StreamKeys(PREFIX)
    return sum(client.xlen(keys.detections(f"cam{i:02d}")) for i in range(CAMERAS))


def measure(
    workers: int, service: ServiceTime, window_s: float, max_batch: int, cluster: bool = False
) -> float:
    """Frames/s of ``workers`` workers over ``window_s`` seconds of steady state."""
    redis_server = LocalRedisCluster() if cluster else EmbeddedRedis(port=free_tcp_port())
    with TemporaryDirectory() as folder, redis_server as server:
        config = write_config(Path(folder) / "scale.yaml", server.url, max_batch, cluster)
        client = connect(server.url, cluster=cluster)
        keys = StreamKeys(PREFIX)
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, "--worker", str(config), f"w{n}"]
                + ["--service", f"{service.base_ms},{service.per_frame_ms}"],
            )
            for n in range(workers)
        ]
        stop = threading.Event()
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # every camera held, every worker holding some
                owners = [client.get(keys.lease(f"cam{i:02d}")) for i in range(CAMERAS)]
                if None not in owners and len(set(owners)) == workers:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("the workers did not share the cameras within 120 s")
            feed_cameras(server.url, stop, frames=1_000_000, cluster=cluster)
            time.sleep(3.0)  # streams filled, batches at their steady size
            first, started = detections(client), time.monotonic()
            time.sleep(window_s)
            done, ended = detections(client), time.monotonic()
            return (done - first) / (ended - started)
        finally:
            stop.set()
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
            client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts to measure")
    parser.add_argument("--service", default="20,10", help="base_ms,per_frame_ms of a batch")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per worker count (median)")
    parser.add_argument(
        "--redis", default="single", help="single, cluster or both (single,cluster)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "ID"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    base, per_frame = (float(v) for v in args.service.split(","))
    service = ServiceTime(base, per_frame)
    if args.worker:
        return run_worker(*args.worker, service)
    counts = [int(n) for n in args.workers.split(",")]
    kinds = args.redis.split(",")
    if not set(kinds) <= {"single", "cluster"}:
        parser.error(f"--redis: single, cluster or both, not {args.redis!r}")
    rates = {(kind, n): [] for kind in kinds for n in counts}
    for _ in range(args.rounds):  # interleaved: drift on a shared machine hits every run
        for kind in kinds:
            for n in counts:
                rate = measure(n, service, args.window, args.max_batch, kind == "cluster")
                rates[kind, n].append(rate)
    ideal = args.max_batch / service.seconds(args.max_batch)
    print(
        f"simulated detector (sleep, not CPU bound): {service.base_ms:g} + "
        f"{service.per_frame_ms:g} ms x batch; {CAMERAS} cameras; one worker at full batches "
        f"could do {ideal:.0f} frames/s"
    )
    report: dict[str, Any] = {"service_ms": [base, per_frame], "cameras": CAMERAS, "runs": {}}
    for kind in kinds:
        one = statistics.median(rates[kind, counts[0]]) / counts[0]
        print(f" {kind} Redis" if kind == "single" else " Redis Cluster (3 masters)")
        for n in counts:
            median = statistics.median(rates[kind, n])
            ratio = median / (n * one)
            runs = ", ".join(f"{r:.0f}" for r in rates[kind, n])
            print(f"  {n} worker(s): {median:7.1f} frames/s (runs {runs}); {ratio:.2f} x linear")
            figures = {"frames_per_s": rates[kind, n], "median": median, "of_linear": ratio}
            if kind == "single":  # the layout earlier reports used
                report["runs"][n] = figures
            else:
                report.setdefault("cluster_runs", {})[n] = figures
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
