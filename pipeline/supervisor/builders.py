"""Builders: each part of a run made from the config, for the composition root
(:mod:`pipeline.daemon`) and the tools that assemble parts of a run (bench, bench-gpu).

Config is resolved here once: per-camera effective settings (camera overrides batching) and the
bound of the batching queue, which the policy and the shm ring size both use.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from detectors.backends import backend_name_for, load_backend, plugin, takes_any_size
from detectors.base import BackendOptions, ModelInfo
from detectors.detector import Detector
from detectors.postprocess import Thresholds
from detectors.preprocess import Letterbox
from pipeline.batching import BatchPolicy, CameraRules, make_policy
from pipeline.batching.queues import queue_bound
from pipeline.config import BatchingConfig, CameraConfig, Config, ConfigError
from streams.decode_worker import DecoderSpec
from streams.transport import TransportSpec

log = logging.getLogger(__name__)


def queue_frames(config: Config) -> int:
    """Frames the batching queue holds at most (:func:`~pipeline.batching.queues.queue_bound`
    of the configured cameras)."""
    batching = config.batching
    return queue_bound(batching.max_batch_size, len(config.cameras), batching.max_queue_frames)


FILE_JOB_MAX_WAIT_MS = 1000.0  # how long a file job's frame may wait for a fuller batch
YOLO_STRIDE = 32  # YOLOv8's largest stride: a rectangular input is a multiple of it


def frame_letterbox(config: Config) -> Letterbox:
    """How the decoders letterbox frames: to the square model input, or with ``model.rect``
    (by default where the model takes any height and width) to each frame's minimum
    stride-aligned rectangle, as Ultralytics' ``predict(rect=True)`` does."""
    model = config.model
    if model.rect is False:  # square: the model file is not needed (a decode-only host)
        return Letterbox(model.imgsz, model.imgsz, rect=False, stride=YOLO_STRIDE)
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
    device = device or model.worker_devices[0]
    instances, threads = inference_instances(config, device)
    options = BackendOptions(
        imgsz=model.imgsz,
        device=device,
        threads=threads,
        half=model.half,
        max_batch=batching.max_batch_size,
        thresholds=thresholds,
        nms=model.nms,
        double_buffer=model.double_buffer,
        cuda_graphs=model.cuda_graphs,
    )
    backend = load_backend(model.path, model.backend, options)
    more = [load_backend(model.path, model.backend, options) for _ in range(instances - 1)]
    detector = Detector(backend, thresholds=thresholds, instances=more)
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
    shape = run_shape(config, info)
    detector.warmup(seeded_sizes(batching), shape)
    log.info(
        "model %s on %s (%s): %d instance(s) x %s thread(s), %dx%d batches of up to %d, warm",
        model.path.name,
        device,
        info.backend,
        detector.instances,
        threads or "default",
        shape[1],
        shape[0],
        batching.max_batch_size,
    )
    return detector


def run_shape(config: Config, info: ModelInfo) -> tuple[int, int]:
    """(height, width) of the batches to warm up and time the model with: a 16:9 source's
    rectangle (640x384 at 640, the common camera's) where frames are letterboxed to their
    minimum rectangle, else the model's input.  Decided as ``frame_letterbox`` decides, from
    the loaded model's facts instead of a second look at the file."""
    rect = info.any_size if config.model.rect is None else config.model.rect
    if rect and info.any_size:
        return Letterbox(info.input_width, info.input_height, rect=True).shape_for(1920, 1080)
    return info.input_height, info.input_width


def inference_instances(config: Config, device: str) -> tuple[int, int | None]:
    """(instances of the model, threads each) for one detector worker on ``device``.

    Unset, ONNX Runtime on a CPU with two threads or more runs two sessions side by side, with
    half the threads each: YOLOv8n's small layers leave a two-thread session waiting at its own
    thread pool's barriers, and two sessions keep both cores busy (measured 1.12-1.17x the
    images/s of one session at batch 8, docs/benchmarks.md).  More than two would only
    lengthen each batch.
    """
    model = config.model
    threads = model.threads or len(os.sched_getaffinity(0))
    instances = model.instances
    if instances is None:
        splits = plugin(backend_name_for(model.path, model.backend)).cpu_instances
        instances = 2 if splits and device == "cpu" and threads >= 2 else 1
    if instances == 1:
        return 1, model.threads
    return instances, max(1, threads // instances)


def seeded_sizes(batching: BatchingConfig) -> list[int]:
    """The batch sizes warmed up and timed before the first frame (the policy's t(b) seeds): one,
    the preferred ones and the largest."""
    return sorted({1, *batching.preferred_batch_sizes, batching.max_batch_size})


def shard_cameras(cameras: list[str], workers: int) -> list[list[str]]:
    """Cameras dealt round-robin to the detector workers: a camera stays on one worker, so its
    results keep their order and its frames are counted in one place."""
    return [cameras[index::workers] for index in range(workers)]


def camera_rules(config: Config, camera: CameraConfig, *, until_done: bool) -> CameraRules:
    """How one camera's frames are batched (its settings override batching's)."""
    batching = config.batching
    # freshness only where frames may drop (live cameras and files replayed like them),
    # never for backpressured file jobs
    droppable = decoder_spec(camera, default_backlog=1, until_done=until_done).backpressure is False
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


def batching_policy(config: Config, *, until_done: bool) -> BatchPolicy[Any]:
    """The configured policy, with each camera's rules."""
    batching = config.batching
    return make_policy(
        batching.policy,
        max_batch_size=batching.max_batch_size,
        max_wait_ms=batching.max_wait_ms,
        preferred_batch_sizes=batching.preferred_batch_sizes,
        max_queue_frames=queue_frames(config),
        camera_rules={
            camera.id: camera_rules(config, camera, until_done=until_done)
            for camera in config.cameras
        },
        options=batching.policy_options,
    )


def sampled_fps(camera: CameraConfig) -> float | None:
    """The rate at which a camera's frames reach the batcher, where the config says it (the
    policy measures it otherwise; ``max_fps`` alone is only a bound)."""
    if not camera.fps:
        return None
    return min(camera.fps / camera.vid_stride, camera.max_fps or camera.fps)


def decode_threads(config: Config, cameras: int | None = None) -> int:
    """Threads per decoder: FFmpeg's frame threading while there are fewer cameras than
    cores, else one each (the cores are busy anyway, and threading costs ~20 % more CPU per
    frame: docs/benchmarks.md).  ``cameras``: how many the run decodes (default: the
    config's; cameras added live count too)."""
    count = len(config.cameras) if cameras is None else cameras
    return 1 if count >= len(os.sched_getaffinity(0)) else 0


LIVE_BACKLOG_S = 1.0  # a sampled live camera's frames waiting in Redis: what it sends in this


def decoder_spec(
    camera: CameraConfig,
    *,
    default_backlog: int,
    until_done: bool,
    decode_threads: int = 0,
    live_backlog: int | None = None,
) -> DecoderSpec:
    """How a camera's decode worker behaves in this run.  ``live_backlog``: the default
    backlog of a camera that drops frames (live, or a file played like one), when smaller:
    frames beyond it only age while they wait, so its decoder skips them at the source.  A
    camera sampled at ``max_fps`` keeps what it sends in :data:`LIVE_BACKLOG_S`, at least one
    frame: eight frames of a camera at 0.5 fps are 16 s old by the time the last is read.  The
    stream holds a frame until it is published, so with room for one the next frame sheds when
    the one before is still unpublished a frame interval later, i.e. the pipeline is behind
    (measured: room for two doubled the p99 latency of 32 cameras at 0.5 fps, 1.2 -> 3.4 s)."""
    live = camera.is_live
    realtime = camera.paced
    # Replays never drop; a file played "like a camera" in the daemon keeps the freshest
    # frames, and one replayed as the live camera it stands for (as_live) does so everywhere.
    backpressure = not (live or camera.as_live) and (until_done or not realtime)
    if live_backlog is not None and camera.max_fps is not None:
        live_backlog = min(live_backlog, max(1, math.ceil(camera.max_fps * LIVE_BACKLOG_S)))
    backlog = (
        default_backlog if backpressure else min(default_backlog, live_backlog or default_backlog)
    )
    return DecoderSpec(
        camera=camera.id,
        url=camera.url,
        live=live,
        realtime=realtime,
        loop=camera.loop,
        backpressure=backpressure,
        max_backlog=camera.max_backlog or backlog,
        fps=camera.fps,
        vid_stride=camera.vid_stride,
        max_fps=camera.max_fps,
        decode_frames=camera.decode_frames,
        decode_threads=decode_threads,
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
