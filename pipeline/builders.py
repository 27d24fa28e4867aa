"""Builders: each part of a run made from the config, for the composition root
(:mod:`pipeline.daemon`) and the tools that assemble parts of a run (bench, bench-gpu).

Config is resolved here once: per-camera effective settings (camera overrides batching) and the
bound of the batching queue, which the policy and the shm ring size both use.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from detectors.base import BackendOptions
from detectors.detector import Detector
from detectors.postprocess import Thresholds
from detectors.preprocess import Letterbox
from detectors.registry import load_backend, takes_any_size
from pipeline.batching import BatchPolicy, CameraRules, make_policy
from pipeline.config import CameraConfig, Config, ConfigError
from streams.decode_worker import DecoderSpec
from streams.transport import TransportSpec


def queue_frames(config: Config) -> int:
    """Frames the batching queue holds at most: room for a read of one frame per camera on
    top of the batches being formed."""
    batching = config.batching
    return max(batching.max_queue_frames or 4 * batching.max_batch_size, 2 * len(config.cameras))


FILE_JOB_MAX_WAIT_MS = 1000.0  # how long a file job's frame may wait for a fuller batch
YOLO_STRIDE = 32  # YOLOv8's largest stride: a rectangular input is a multiple of it


def frame_letterbox(config: Config) -> Letterbox:
    """How the decoders letterbox frames: to the square model input, or with ``model.rect``
    (by default where the model takes any height and width) to each frame's minimum
    stride-aligned rectangle, as Ultralytics' ``predict(rect=True)`` does."""
    model = config.model
    any_size = takes_any_size(model.path, model.backend)
    rect = any_size if model.rect is None else model.rect
    if rect and not any_size:
        raise ValueError(
            f"model.rect is true but {model.path.name} takes {model.imgsz}x{model.imgsz} images "
            "only with this backend: use an ONNX model with a dynamic height and width "
            "(framebatch export --format onnx) or set model.rect: false"
        )
    return Letterbox(model.imgsz, model.imgsz, rect=rect, stride=YOLO_STRIDE)


def load_detector(config: Config, device: str | None = None) -> Detector:
    """The detector one worker uses: the configured backend on ``device`` (default: the
    configured one), thresholds, and warm-up of every size the policy may dispatch."""
    model = config.model
    batching = config.batching
    classes = tuple(model.classes) if model.classes is not None else None
    thresholds = Thresholds(conf=model.conf, iou=model.iou, max_det=model.max_det, classes=classes)
    options = BackendOptions(
        imgsz=model.imgsz,
        device=device or model.worker_devices[0],
        threads=model.threads,
        half=model.half,
        max_batch=batching.max_batch_size,
        thresholds=thresholds,
        nms=model.nms,
        double_buffer=model.double_buffer,
        cuda_graphs=model.cuda_graphs,
    )
    backend = load_backend(model.path, model.backend, options)
    detector = Detector(backend, thresholds=thresholds)
    info = detector.info
    problem = None
    if detector.letterbox() != Letterbox(model.imgsz, model.imgsz):
        problem = (
            f"model.imgsz is {model.imgsz} but {model.path.name} takes "
            f"{info.input_width}x{info.input_height} images: set model.imgsz to match"
        )
    elif info.max_batch is not None and batching.max_batch_size > info.max_batch:
        problem = (
            f"batching.max_batch_size is {batching.max_batch_size} but {model.path.name} "
            f"takes at most {info.max_batch} images: lower it or rebuild the model"
        )
    elif info.min_batch > 1:
        problem = f"{model.path.name} takes batches of {info.min_batch} or more, not of 1"
    if problem is not None:
        detector.close()
        raise ValueError(problem)
    backend.warmup(sorted({1, *batching.preferred_batch_sizes, batching.max_batch_size}))
    return detector


def shard_cameras(cameras: list[str], workers: int) -> list[list[str]]:
    """Cameras dealt round-robin to the detector workers: a camera stays on one worker, so its
    results keep their order and its frames are counted in one place."""
    return [cameras[index::workers] for index in range(workers)]


def time_batches(
    detector: Detector, sizes: set[int], letterbox: Letterbox | None = None
) -> list[tuple[int, float]]:
    """One timed inference per batch size (after warm-up): seeds the policy's service model.
    With a rectangular ``letterbox`` the batches are of a 16:9 source's shape (640x384 at
    640), the common camera's, rather than the square the model would otherwise be timed at."""
    info = detector.info
    height, width = info.input_height, info.input_width
    if letterbox is not None and letterbox.rect:
        height, width = letterbox.shape_for(1920, 1080)
    samples = []
    for size in sorted(sizes):
        blank = [np.full((height, width, 3), 114, np.uint8)] * size
        prepared = detector.prepare(blank)
        started = time.perf_counter()
        detector.infer(prepared)
        samples.append((size, time.perf_counter() - started))
    return samples


def batching_policy(config: Config, *, until_done: bool) -> BatchPolicy[Any]:
    """The configured policy, with each camera's rules (camera settings override batching's)."""
    batching = config.batching

    def rules(camera: CameraConfig) -> CameraRules:
        # freshness only where frames may drop (live cameras and files replayed like them),
        # never for backpressured file jobs
        droppable = (
            decoder_spec(camera, default_backlog=1, until_done=until_done).backpressure is False
        )
        max_age = camera.max_frame_age_ms or batching.max_frame_age_ms
        max_wait_ms = batching.max_wait_ms if camera.max_wait_ms is None else camera.max_wait_ms
        max_wait_frames = camera.max_wait_frames or batching.max_wait_frames
        if not droppable and camera.max_wait_ms is None:
            # a file job's frames keep no freshness: they may wait for the batch that gives the
            # most frames per second (bounded), not leave half-full after a frame interval
            max_wait_ms, max_wait_frames = max(max_wait_ms, FILE_JOB_MAX_WAIT_MS), None
        return CameraRules(
            priority=camera.priority,
            max_wait_frames=max_wait_frames,
            max_wait_ms=max_wait_ms,
            max_frame_age_ms=max_age if droppable else None,
            keep_latest=camera.keep_latest and droppable,
            fps=sampled_fps(camera),
            backlogged=not droppable,
        )

    return make_policy(
        batching.policy,
        max_batch_size=batching.max_batch_size,
        max_wait_ms=batching.max_wait_ms,
        preferred_batch_sizes=batching.preferred_batch_sizes,
        max_queue_frames=queue_frames(config),
        camera_rules={camera.id: rules(camera) for camera in config.cameras},
        target_utilisation=batching.target_utilisation,
        latency_target_ms=batching.latency_target_ms,
    )


def sampled_fps(camera: CameraConfig) -> float | None:
    """The rate at which a camera's frames reach the batcher, where the config says it (the
    policy measures it otherwise; ``max_fps`` alone is only a bound)."""
    if not camera.fps:
        return None
    return min(camera.fps / camera.vid_stride, camera.max_fps or camera.fps)


def decoder_spec(camera: CameraConfig, *, default_backlog: int, until_done: bool) -> DecoderSpec:
    """How a camera's decode worker behaves in this run."""
    live = camera.is_live
    realtime = True if live else bool(camera.realtime)
    return DecoderSpec(
        camera=camera.id,
        url=camera.url,
        live=live,
        realtime=realtime,
        loop=camera.loop,
        # Replays never drop; a file played "like a camera" in the daemon keeps the freshest frames.
        backpressure=not live and (until_done or not realtime),
        max_backlog=camera.max_backlog or default_backlog,
        fps=camera.fps,
        vid_stride=camera.vid_stride,
        max_fps=camera.max_fps,
    )


def transport_spec(config: Config) -> TransportSpec:
    """How the decoders send pixels. A shm ring also keeps room for the frames the batching
    queue holds (a live stream may trim their entries while they wait), sized as below."""
    transport = config.transport
    return TransportSpec(
        kind=transport.kind,
        jpeg_quality=transport.jpeg_quality,
        shm_slots=transport.shm_slots,
        shm_in_flight=queue_frames(config),
    )


def check_run_mode(config: Config, *, until_done: bool) -> None:
    """Config combinations that are valid YAML but cannot work in this mode."""
    if not until_done:
        return
    errors = [
        f"cameras[{i}].loop: a looping file never ends; --until-done needs loop: false"
        for i, camera in enumerate(config.cameras)
        if camera.loop
    ]
    if all(camera.is_live for camera in config.cameras):
        errors.append(
            "cameras: --until-done needs at least one file source (live cameras never end)"
        )
    if errors:
        raise ConfigError(errors, source="--until-done")
