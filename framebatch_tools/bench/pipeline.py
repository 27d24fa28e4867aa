"""``framebatch bench``: the detector alone vs the pipeline end to end, in alternating rounds.

A round times the detector alone on real letterboxed frames, then one ``--until-done`` replay
through the real pipeline with a :class:`TimedDetector`; the machine is noisy, so figures are
medians over rounds. Then each non-inference stage is timed on its own, per frame.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import astuple
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np
import onnxruntime
import redis

from detectors.base import BatchOutput
from detectors.detector import Detector
from detectors.preprocess import Letterbox, Letterboxed
from framebatch_tools.bench.report import format_report
from pipeline.config import Config, ConfigError, load_config
from pipeline.daemon import Pipeline
from pipeline.supervisor.builders import (
    check_run_mode,
    decode_threads,
    frame_letterbox,
    load_detector,
    transport_spec,
)
from streams.embedded_redis import EmbeddedRedis, RedisServerError
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import Detection, DetectionMessage, FrameMessage, Timestamps
from streams.sources import SourceError, VideoSource
from streams.transport import FrameDecoder, make_encoder

log = logging.getLogger("framebatch.bench")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
TARGET_RATIO = 0.95
POOL_STRIDE = 10  # every 10th decoded frame is kept: ~36 frames, ~45 MB for the bench clips
STAGE_BATCHES = 10  # timed batches per stage in the per-frame step


class TimedDetector:
    """A detector whose three stages add their wall time to accumulators; the rest delegates.

    Prepare and post-process each run on one pipeline thread, so their accumulators have a
    single writer; inference runs on one thread per instance, under a lock.
    """

    def __init__(self, inner: Detector):
        self._inner = inner
        self.seconds = {"prepare": 0.0, "infer": 0.0, "postprocess": 0.0}
        self.images = 0
        # Pipeline builds the batcher right after the factory returns: this is its start.
        self.created = time.perf_counter()
        self.first_infer: float | None = None
        self.last_infer = 0.0
        self._infer_lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _timed(self, stage: str, call: Any, *args: Any) -> tuple[Any, float, float]:
        start = time.perf_counter()
        result = call(*args)
        end = time.perf_counter()
        self.seconds[stage] += end - start
        return result, start, end

    def prepare(self, images: Sequence[np.ndarray]) -> Any:
        return self._timed("prepare", self._inner.prepare, images)[0]

    def infer(self, prepared: Any, instance: int = 0) -> BatchOutput:
        start = time.perf_counter()
        output = self._inner.infer(prepared, instance)
        end = time.perf_counter()
        with self._infer_lock:  # instances of the model infer on threads of their own
            self.seconds["infer"] += end - start  # instance-seconds: up to instances x wall
            self.first_infer = min(self.first_infer or start, start)
            self.last_infer = max(self.last_infer, end)
            self.images += len(output)
        return output

    def postprocess(self, output: BatchOutput, geometries: Sequence[Any]) -> list[Any]:
        return self._timed("postprocess", self._inner.postprocess, output, geometries)[0]


def machine_info() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    models = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    return {
        "platform": platform.platform(),
        "cpu_model": models[0] if models else platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "av": av.__version__,
        "load_before": os.getloadavg(),
    }


def decode_clips(config: Config, letterbox: Letterbox) -> tuple[list[dict], list[Letterboxed]]:
    """Decode every clip through ``VideoSource`` (PyAV + bgr24) and letterbox each frame, with
    the decoders' thread settings, timing the CPU of both; keep every POOL_STRIDE-th letterboxed
    frame for the detector."""
    clips, pool = [], []
    threads = decode_threads(config)
    opencv_threads = cv2.getNumThreads()
    cv2.setNumThreads(0)  # as each decoder process runs OpenCV
    try:
        for camera in config.cameras:
            clips.append(_decode_clip(camera, letterbox, threads, pool))
    finally:
        cv2.setNumThreads(opencv_threads)
    return clips, pool


def _decode_clip(camera, letterbox: Letterbox, threads: int, pool: list[Letterboxed]) -> dict:
    # CPU time, not wall: FFmpeg's frame threads count (process_time covers every thread;
    # with frame threading their decoding while the main thread letterboxes is charged to the
    # letterbox, so only the sum is exact then; decoders run one thread at cameras >= cores)
    clock = time.process_time
    frames, decode_s, letterbox_s = 0, 0.0, 0.0
    with VideoSource(camera.id, camera.url, decode_threads=threads) as source:
        start = clock()
        for frames, decoded in enumerate(source.frames(), 1):
            decoded_at = clock()
            boxed = letterbox(decoded.image)
            if frames % POOL_STRIDE == 1:
                pool.append(boxed)
            decode_s, start = decode_s + decoded_at - start, clock()
            letterbox_s += start - decoded_at
    if not frames:
        raise SourceError(f"camera {camera.id!r}: {camera.url} has no frames")
    height, width = decoded.image.shape[:2]
    figures = {"frames": frames, "decode_s": decode_s, "letterbox_s": letterbox_s}
    return {"camera": camera.id, "size": f"{width}x{height}", **figures}


def same_shape(pool: list[Letterboxed]) -> list[Letterboxed]:
    """The frames of the most common shape (rectangular letterboxing gives each source aspect
    its own; a batch holds one)."""
    shapes = Counter(boxed.pixels.shape for boxed in pool)
    common = shapes.most_common(1)[0][0] if shapes else None
    return [boxed for boxed in pool if boxed.pixels.shape == common]


def time_detector(detector: Detector, pool: list[Letterboxed], size: int, repeats: int) -> dict:
    """One warm-up then ``repeats`` timed prepare + infer + postprocess calls at one batch size
    on every instance of the model at once (one thread each, as in the pipeline); images/s over
    the wall time of all, and each stage's median seconds per call per image, divided by the
    instances (what a stage costs the throughput when every instance is busy)."""
    instances = detector.instances
    calls: list[tuple[float, float, float, float]] = []
    ready = threading.Barrier(instances + 1)

    def work(instance: int) -> None:
        for call in range(repeats + 1):
            if call == 1:
                ready.wait()  # every instance warmed up: the timed part starts
            first = (call * instances + instance) * size
            batch = [pool[(first + k) % len(pool)] for k in range(size)]
            t0 = time.perf_counter()
            tensor = detector.prepare([b.pixels for b in batch])
            t1 = time.perf_counter()
            output = detector.infer(tensor, instance)
            t2 = time.perf_counter()
            detector.postprocess(output, [b.geometry for b in batch])
            t3 = time.perf_counter()
            if call:
                calls.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2))  # list.append is atomic

    threads = [threading.Thread(target=work, args=(i,)) for i in range(instances)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    _, prepare, infer, postprocess = (
        statistics.median(times) / size / instances for times in zip(*calls, strict=True)
    )
    images_per_s = instances * repeats * size / wall
    return {
        "batch_size": size,
        "instances": instances,
        "images_per_s": images_per_s,
        "per_image_s": 1 / images_per_s,
        "prepare_per_image_s": prepare,
        "infer_per_image_s": infer,
        "postprocess_per_image_s": postprocess,
    }


def run_pipeline(config: Config) -> dict[str, Any]:
    """One ``--until-done`` replay with a timed detector; raises if a camera failed."""
    timed: list[TimedDetector] = []

    def timed_detector(c: Config, device: str) -> TimedDetector:
        timed.append(TimedDetector(load_detector(c, device)))
        return timed[-1]

    run_start = time.perf_counter()
    summary = Pipeline.init_run(
        config, until_done=True, detector_factory=timed_detector, serve_http=False
    ).run()
    failed = [c.camera for c in summary.cameras if c.end_reason in ("error", "crashed")]
    if failed or not timed or timed[-1].first_infer is None:
        raise RuntimeError(f"failed cameras {failed} or no inference: the figures would be wrong")
    detector = timed[-1]
    window_s = detector.last_infer - detector.first_infer
    infer_s = detector.seconds["infer"] / detector.instances
    # the summary's wall time starts a few ms after init_run() began: once Redis answers
    startup_s = min(detector.first_infer - run_start, summary.wall_s)
    return {
        "processed": summary.processed,
        "dropped": sum(summary.dropped.values()),
        "mean_batch_size": summary.mean_batch_size,
        "wall_s": summary.wall_s,
        "processing_s": summary.processing_s,
        "fps_wall": summary.throughput_fps,
        "fps_window": summary.processed / summary.processing_s,
        "latency_p50_s": summary.latency_p50_s,
        "latency_p99_s": summary.latency_p99_s,
        **{f"{stage}_per_image_s": s / detector.images for stage, s in detector.seconds.items()},
        # instance-seconds over instances: the wall time every instance was busy
        "infer_per_image_s": infer_s / detector.images,
        "infer_busy_fraction": infer_s / window_s if window_s else 1.0,
        "startup_s": startup_s,
        "idle_s": window_s - infer_s,
        "tail_s": max(0.0, summary.wall_s - startup_s - window_s),
    }


def compare(alone: dict[str, dict], pipe: dict[str, Any]) -> dict[str, Any]:
    """The pipeline against the best batch size of the detector alone in the same round, and
    the gap cut into parts: wall = ideal - overlapped + slowdown + start-up + idle + tail."""
    best = max(alone.values(), key=lambda run: run["images_per_s"])
    processed = pipe["processed"]
    slowdown = pipe["infer_per_image_s"] - best["infer_per_image_s"]
    return {
        "best_batch_size": best["batch_size"],
        "alone_images_per_s": best["images_per_s"],
        "alone_infer_per_image_s": best["infer_per_image_s"],
        "ratio_wall": pipe["fps_wall"] / best["images_per_s"],
        "ratio_window": pipe["fps_window"] / best["images_per_s"],
        "infer_slowdown_per_image_s": slowdown,
        "ideal_s": processed * best["per_image_s"],
        # prepare + postprocess: in the alone figure, but off the detector thread in the pipeline
        "overlapped_s": processed * (best["per_image_s"] - best["infer_per_image_s"]),
        "infer_slowdown_s": processed * slowdown,
    }


def medians(rounds: list[dict]) -> dict[str, Any]:
    """Median over rounds of every figure (one round on a noisy machine proves little)."""

    def median_of(figures: list[dict]) -> dict[str, float]:
        numbers = [k for k, v in figures[0].items() if isinstance(v, int | float)]
        return {k: statistics.median(f[k] for f in figures) for k in numbers}

    alone = {size: median_of([r["alone"][size] for r in rounds]) for size in rounds[0]["alone"]}
    compared = median_of([r["compare"] for r in rounds])
    del compared["best_batch_size"]  # a median of batch sizes means nothing; see below
    return {
        "alone": alone,
        "best_batch_size": int(max(alone, key=lambda size: alone[size]["images_per_s"])),
        "pipeline": median_of([r["pipeline"] for r in rounds]),
        "compare": compared,
    }


def redis_costs(
    config: Config, pool: list[Letterboxed], results: list[Any], label
) -> tuple[dict, str]:
    """Median seconds per frame of the decoder's XLEN + encode + XADD, the batcher's XREADGROUP
    + pixels out, XACK + XDEL and detection XADD, with the config's transport, on a private
    redis-server (one op at a time: the batcher pipelines its ack with the detections, which
    only saves a round trip)."""
    size, keys = config.batching.max_batch_size, StreamKeys("bench")
    key, maxlen = keys.frames("cam"), config.redis.frames_maxlen
    detections_key, kept = keys.detections("cam"), config.redis.detections_maxlen
    times: dict[str, list[float]] = {"frame_xadd": [], "xreadgroup": [], "ack": [], "det": []}
    with EmbeddedRedis() as server, ExitStack() as stack:
        client = redis.Redis.from_url(server.url)
        stack.callback(client.close)
        client.xgroup_create(key, FRAMES_GROUP, id="0", mkstream=True)
        encoder = make_encoder(
            transport_spec(config),
            redis_url=server.url,
            prefix=f"bench{os.getpid()}",
            camera="cam",
            max_backlog=maxlen,
            pid=os.getpid(),
            max_frame_bytes=max(boxed.pixels.nbytes for boxed in pool),
        )
        stack.callback(encoder.close)  # a shm ring of this prefix: no daemon would remove it
        frames_out = FrameDecoder()
        stack.callback(frames_out.close)
        encodings: Counter[str] = Counter()
        for batch in range(STAGE_BATCHES + 1):  # batch 0 warms up the connection and stream
            t0 = time.perf_counter()
            for k in range(size):
                seq, now = (batch * size + k) % len(pool), time.time()
                boxed = pool[seq]
                height, width = boxed.pixels.shape[:2]
                encoded = encoder.encode(boxed.pixels)
                frame = FrameMessage(
                    *("cam", seq, None, *astuple(boxed.geometry), now, now, encoded.pixels),
                    input_width=width,
                    input_height=height,
                    encoding=encoded.encoding,
                    shm=encoded.shm,
                )
                client.xlen(key)  # the decoder's backpressure check
                client.xadd(key, frame.to_fields(), maxlen=maxlen, approximate=True)
            t1 = time.perf_counter()
            reply = client.xreadgroup(FRAMES_GROUP, "bench", {key: ">"}, count=size)
            entries = [(eid, FrameMessage.from_fields(f)) for eid, f in reply[0][1]]
            for _, frame in entries:
                frames_out.image(frame)  # the batcher's copy out of the ring, or its view
                encodings[frame.encoding] += 1
            t2 = time.perf_counter()
            ids = [eid for eid, _ in entries]
            client.pipeline(False).xack(key, FRAMES_GROUP, *ids).xdel(key, *ids).execute()
            t3 = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for _, frame in entries:
                found = results[frame.seq]
                rows = zip(found.boxes, found.scores, found.class_ids, strict=True)
                detections = tuple(
                    Detection(tuple(map(float, box)), float(score), int(cls), label(int(cls)))
                    for box, score, cls in rows
                )
                head = ("cam", frame.seq, None, frame.width, frame.height, batch, size)
                stamps = Timestamps(frame.captured, frame.enqueued, now, now, now)
                message = DetectionMessage(*head, detections, stamps)
                pipe.xadd(detections_key, message.to_fields(), maxlen=kept, approximate=True)
            pipe.execute()
            t4 = time.perf_counter()
            if batch:
                for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    times[name].append(seconds / size)
    costs = {name: statistics.median(values) for name, values in times.items()}
    return costs, encodings.most_common(1)[0][0]


def per_frame_costs(
    config: Config, detector: Detector, pool: list[Letterboxed], clips
) -> tuple[dict, str]:
    """Seconds per frame of decode, letterbox and the Redis steps, each timed on its own
    (prepare and postprocess come from the detector-alone runs), and the frames' encoding."""
    frames, size = sum(c["frames"] for c in clips), config.batching.max_batch_size
    detections = []  # real detections of every pool frame, for the detection messages
    for batch in (pool[start : start + size] for start in range(0, len(pool), size)):
        detections += detector.detect([b.pixels for b in batch], [b.geometry for b in batch])
    redis_steps, encoding = redis_costs(config, pool, detections, detector.info.label)
    return {
        "decode": sum(c["decode_s"] for c in clips) / frames,
        "letterbox": sum(c["letterbox_s"] for c in clips) / frames,
        **redis_steps,
    }, encoding


def run_bench(args: argparse.Namespace) -> int:
    """The ``framebatch bench`` command: report on stdout, JSON to ``--output``."""
    try:
        sizes = sorted({int(size) for size in args.batch_sizes.split(",") if size.strip()})
        if not sizes or sizes[0] < 1 or args.repeats < 1 or args.rounds < 1:
            raise ValueError("--batch-sizes, --repeats and --rounds take integers >= 1")
        if args.output and not Path(args.output).absolute().parent.is_dir():
            raise ValueError(f"--output: no folder {Path(args.output).absolute().parent}")
        config = load_config(args.config)
        check_run_mode(config, until_done=True)
        data: dict[str, Any] = {"command": shlex.join(sys.argv), "machine": machine_info()}
        detector = load_detector(config)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"framebatch bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    data.update(config=str(args.config), imgsz=config.model.imgsz, repeats=args.repeats, rounds=[])
    try:
        # the decoders' letterbox: rectangular where the model allows (model.rect)
        data["clips"], pool = decode_clips(config, frame_letterbox(config))
        pool = same_shape(pool)
        data["input_shape"] = list(pool[0].pixels.shape[:2]) if pool else None
        for number in range(1, args.rounds + 1):
            log.info("round %d/%d: detector alone, batch sizes %s", number, args.rounds, sizes)
            alone = {str(b): time_detector(detector, pool, b, args.repeats) for b in sizes}
            log.info("round %d/%d: pipeline --until-done", number, args.rounds)
            pipe = run_pipeline(config)
            log.info("round %d: %.2f frames/s", number, pipe["fps_wall"])
            data["rounds"].append(
                {"alone": alone, "pipeline": pipe, "compare": compare(alone, pipe)}
            )
        log.info("per-frame costs of the stages that are not inference")
        data["per_frame_s"], data["transport"] = per_frame_costs(
            config, detector, pool, data["clips"]
        )
    except (SourceError, RedisServerError, RuntimeError) as exc:
        print(f"framebatch bench: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        detector.close()
    data["machine"]["load_after"] = os.getloadavg()
    data.update(medians=medians(data["rounds"]), target_ratio=TARGET_RATIO)
    best = data["medians"]["alone"][str(data["medians"]["best_batch_size"])]
    for stage in ("prepare", "postprocess"):  # timed on their own in the detector-alone runs
        data["per_frame_s"][stage] = best[f"{stage}_per_image_s"]
    print(format_report(data))
    if args.output:
        Path(args.output).write_text(json.dumps(data, indent=2))
    return EXIT_OK
