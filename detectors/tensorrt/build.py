"""Build a dynamic-batch TensorRT engine from a YOLOv8 ONNX model, and check INT8 against FP16.

One optimisation profile on the input (min, opt = the preferred batch, max; with ``rect`` over
height and width too); FP16 and/or INT8
(entropy calibration on letterboxed frames normalised exactly as at run time, with a
calibration cache); a timing cache file that makes rebuilds fast; the engine written with
Ultralytics' JSON header (see ``engine_file``). TensorRT 10.x; imported lazily.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detectors.accuracy import Int8AccuracyReport, compare_detections
from detectors.base import BackendUnavailable
from detectors.metadata import class_names, literal
from detectors.postprocess import ImageDetections, Thresholds, postprocess
from detectors.preprocess import Letterbox, Letterboxed, to_network_input
from detectors.tensorrt.engine import (
    TensorRTEngine,
    import_tensorrt,
    import_torch_cuda,
    tensorrt_major,
)
from detectors.tensorrt.engine_file import OUR_KEY, write_engine_file

log = logging.getLogger(__name__)

GIB = 1 << 30
LITERAL_KEYS = ("stride", "batch", "imgsz", "names", "args", "channels", "end2end", "kpt_shape")


def calibration_batches(
    images: Iterable[np.ndarray], batch_size: int, imgsz: tuple[int, int]
) -> Iterator[np.ndarray]:
    """Full batches of network input from letterboxed HxWx3 uint8 BGR images.

    A last partial batch is dropped: TensorRT calibrates at the profile's opt batch size only.
    """
    pending: list[np.ndarray] = []
    for image in images:
        if image.dtype != np.uint8 or image.shape != (*imgsz, 3):
            raise ValueError(
                f"calibration images must be letterboxed {imgsz[0]}x{imgsz[1]}x3 uint8, "
                f"got {image.shape} {image.dtype}"
            )
        pending.append(image)
        if len(pending) == batch_size:
            yield to_network_input(np.stack(pending))
            pending.clear()


def letterboxed_frames(
    clips: Sequence[Path], letterbox: Letterbox, *, frames_per_clip: int = 64, every: int = 5
) -> Iterator[Letterboxed]:
    """Every ``every``-th frame of each clip, at most ``frames_per_clip`` per clip, letterboxed."""
    import av

    for clip in clips:
        with av.open(str(clip)) as container:
            taken = 0
            for index, frame in enumerate(container.decode(video=0)):
                if taken == frames_per_clip:
                    break
                if index % every == 0:
                    taken += 1
                    yield letterbox(frame.to_ndarray(format="bgr24"))


def onnx_metadata(onnx_path: Path) -> dict[str, str]:
    """The ONNX model's metadata_props (Ultralytics writes names, imgsz, stride, ... there)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return dict(session.get_modelmeta().custom_metadata_map)


def engine_metadata(
    base: Mapping[str, Any],
    *,
    imgsz: tuple[int, int],
    min_batch: int,
    opt_batch: int,
    max_batch: int,
    half: bool,
    int8: bool,
    rect: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON header: Ultralytics' keys (JSON types, not literal strings) plus ours."""
    metadata: dict[str, Any] = {}
    for key, value in base.items():
        if key in LITERAL_KEYS and isinstance(value, str):
            value = literal(value)  # ONNX metadata stores Python literals
        metadata[key] = value
    if "names" in metadata:
        metadata["names"] = dict(enumerate(class_names(metadata["names"])))
    args = dict(metadata.get("args") or {})
    args.update(batch=max_batch, half=half, int8=int8, dynamic=rect or min_batch != max_batch)
    metadata.update(imgsz=list(imgsz), batch=max_batch, args=args)
    metadata[OUR_KEY] = {
        "min_batch": min_batch,
        "opt_batch": opt_batch,
        "max_batch": max_batch,
        "half": half,
        "int8": int8,
        "rect": rect,
        **(extra or {}),
    }
    return metadata


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _calibrator(trt: Any, torch: Any, batches: Iterator[np.ndarray], **kwargs: Any) -> Any:
    """An ``IInt8EntropyCalibrator2`` (its base class exists only once tensorrt is imported)."""

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self, batch_size: int, shape: tuple[int, ...], cache: Path | None, device):
            trt.IInt8EntropyCalibrator2.__init__(self)  # pybind11 needs the base initialised
            self.batch_size, self.cache, self.device = batch_size, cache, device
            self.buffer = torch.empty(shape, dtype=torch.float32, device=device)  # kept alive
            self.batches_fed = 0
            self.cache_read = False
            self.error: BaseException | None = None

        def get_batch_size(self) -> int:
            return self.batch_size

        def get_batch(self, names: list[str]) -> list[int] | None:
            # Called from C++ (noexcept): an escaping exception would abort the process, so keep
            # it and stop calibration; build_engine re-raises it.
            try:
                host = next(batches, None)
                if host is None:
                    return None
                self.buffer.copy_(torch.from_numpy(host))
                torch.cuda.current_stream(self.device).synchronize()  # TensorRT reads on its stream
                self.batches_fed += 1
                return [int(self.buffer.data_ptr())]
            except BaseException as exc:  # noqa: BLE001 - re-raised after the build
                self.error = exc
                return None

        def read_calibration_cache(self) -> bytes | None:
            if self.cache is not None and self.cache.is_file() and self.cache.stat().st_size:
                self.cache_read = True
                return self.cache.read_bytes()
            return None

        def write_calibration_cache(self, cache: memoryview) -> None:
            if self.cache is not None:
                try:
                    _write_atomically(self.cache, bytes(cache))
                except OSError as exc:
                    self.error = exc

    return EntropyCalibrator(**kwargs)


def _parse_onnx(trt: Any, builder: Any, logger: Any, onnx_path: Path) -> tuple[Any, Any]:
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n  ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}:\n  {errors or 'no detail'}")
    if network.num_inputs != 1 or network.num_outputs != 1:
        raise ValueError(
            f"{onnx_path}: expected a YOLOv8 detection model with one input and one output, "
            f"found {network.num_inputs} inputs and {network.num_outputs} outputs"
        )
    return network, parser  # the parser must outlive the network's weights until the build


#: The smallest side a rectangular profile takes: one stride (as Ultralytics' dynamic engines).
MIN_SIDE = 32

Shape = tuple[int, int, int, int]


def profile_shapes(
    *, min_batch: int, opt_batch: int, max_batch: int, height: int, width: int, rect: bool
) -> tuple[Shape, Shape, Shape]:
    """(min, opt, max) input shapes of the optimisation profile. ``rect``: heights and widths
    from one stride up to ``height`` x ``width``, so the engine takes the stride-aligned
    rectangles the decoders letterbox to (640x384 for 16:9); tuned for the square (opt), as
    Ultralytics' dynamic engines are. Otherwise the batch alone varies."""
    low = (MIN_SIDE, MIN_SIDE) if rect else (height, width)
    return (
        (min_batch, 3, *low),
        (opt_batch, 3, height, width),
        (max_batch, 3, height, width),
    )


def build_engine(
    onnx_path: Path,
    engine_path: Path,
    *,
    imgsz: int | tuple[int, int] = 640,
    rect: bool = False,
    min_batch: int = 1,
    opt_batch: int,
    max_batch: int,
    half: bool = True,
    int8: bool = False,
    calibration_images: Iterable[np.ndarray] | None = None,
    calibration_cache: Path | None = None,
    timing_cache: Path | None = None,
    workspace_gib: float | None = 4.0,
    metadata: Mapping[str, Any] | None = None,
    device: int = 0,
    verbose: bool = False,
) -> Path:
    """Build and write ``engine_path`` (with Ultralytics' header); returns it.

    ``rect``: the profile spans heights and widths up to ``imgsz`` (the ONNX model's H and W
    must be dynamic). ``metadata`` defaults to the ONNX model's own (names, stride, ...). INT8 needs
    ``calibration_images`` (letterboxed HxWx3 uint8 BGR, at least ``opt_batch`` of them)
    unless ``calibration_cache`` already holds a table from an earlier build.
    """
    height, width = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    if not 1 <= min_batch <= opt_batch <= max_batch:
        raise ValueError(
            f"need 1 <= min_batch <= opt_batch <= max_batch, got {min_batch}, "
            f"{opt_batch}, {max_batch}"
        )
    cache_ready = calibration_cache is not None and Path(calibration_cache).is_file()
    if int8 and calibration_images is None and not cache_ready:
        raise ValueError("int8 needs calibration_images or an existing calibration_cache file")
    trt = import_tensorrt()
    if tensorrt_major(trt) != 10:
        raise BackendUnavailable(
            f"this builder needs TensorRT 10.x: TensorRT {trt.__version__} removed the FP16/INT8 "
            "builder flags and the INT8 calibrator; build with trtexec or Ultralytics' exporter "
            "on it and load the engine here"
        )
    torch = import_torch_cuda()
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    base = dict(metadata) if metadata is not None else onnx_metadata(onnx_path)
    cuda = torch.device("cuda", device)

    logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
    with torch.cuda.device(cuda):
        builder = trt.Builder(logger)
        network, _parser = _parse_onnx(trt, builder, logger, onnx_path)
        model_input = network.get_input(0)
        shape = tuple(model_input.shape)
        if len(shape) != 4:
            raise ValueError(f"{onnx_path}: input {model_input.name} is {shape}, not NCHW")
        if shape[0] != -1 and not min_batch == max_batch == shape[0]:
            raise ValueError(
                f"{onnx_path}: input {model_input.name} has a fixed batch of {shape[0]}; export "
                "the ONNX model with a dynamic batch axis (Ultralytics: dynamic=True)"
            )
        for axis, size in ((2, height), (3, width)):
            if shape[axis] not in (-1, size):
                raise ValueError(f"{onnx_path}: input is {shape}, which is not {height}x{width}")
            if rect and shape[axis] != -1:
                raise ValueError(
                    f"{onnx_path}: input is {shape}: a rect engine needs a dynamic height and "
                    "width (framebatch export --format onnx writes them)"
                )
        if half and not int8:
            # FP16 input halves the normalised batch; outputs stay as exported (FP32 boxes).
            # INT8 builds keep the exported input type: calibration feeds it FP32 batches.
            model_input.dtype = trt.float16

        config = builder.create_builder_config()
        if workspace_gib:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * GIB))
        profile = builder.create_optimization_profile()
        profile.set_shape(
            model_input.name,
            *profile_shapes(
                min_batch=min_batch,
                opt_batch=opt_batch,
                max_batch=max_batch,
                height=height,
                width=width,
                rect=rect,
            ),
        )
        config.add_optimization_profile(profile)
        if half:
            config.set_flag(trt.BuilderFlag.FP16)
        calibrator = None
        if int8:
            config.set_flag(trt.BuilderFlag.INT8)
            # TensorRT 10 calibrates with the first profile's opt shape (set_calibration_profile
            # is deprecated there), so calibration batches have opt_batch images.
            calibrator = _calibrator(
                trt,
                torch,
                calibration_batches(
                    () if calibration_images is None else calibration_images,
                    opt_batch,
                    (height, width),
                ),
                batch_size=opt_batch,
                shape=(opt_batch, 3, height, width),
                cache=Path(calibration_cache) if calibration_cache else None,
                device=cuda,
            )
            config.int8_calibrator = calibrator

        timing_cache = Path(timing_cache) if timing_cache else None
        previous = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
        timing = config.create_timing_cache(previous)
        if timing is None or not config.set_timing_cache(timing, ignore_mismatch=False):
            log.warning(
                "timing cache %s is unusable here (another TensorRT or GPU?); starting afresh",
                timing_cache,
            )
            config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)

        log.info(
            "building %s from %s (batch %d/%d/%d, fp16=%s, int8=%s, rect=%s)",
            engine_path.name,
            onnx_path.name,
            min_batch,
            opt_batch,
            max_batch,
            half,
            int8,
            rect,
        )
        serialized = builder.build_serialized_network(network, config)

    if calibrator is not None and calibrator.error is not None:
        raise RuntimeError(f"INT8 calibration failed: {calibrator.error}") from calibrator.error
    if serialized is None:
        hint = ""
        if calibrator is not None and not calibrator.cache_read and calibrator.batches_fed == 0:
            hint = f" INT8 calibration got no batch: give at least {opt_batch} images."
        raise RuntimeError(
            f"TensorRT could not build {engine_path.name} (see its log above).{hint}"
        )
    if timing_cache is not None:
        _write_atomically(
            Path(timing_cache), bytes(memoryview(config.get_timing_cache().serialize()))
        )
    header = engine_metadata(
        base,
        imgsz=(height, width),
        min_batch=min_batch,
        opt_batch=opt_batch,
        max_batch=max_batch,
        half=half,
        int8=int8,
        rect=rect,
        extra={"tensorrt": trt.__version__, "source": onnx_path.name},
    )
    write_engine_file(engine_path, memoryview(serialized), header)
    return engine_path


def _detect(engine: TensorRTEngine, batch: list[Letterboxed], thresholds: Thresholds) -> list:
    import torch

    from detectors.device.runner import normalise

    pixels = torch.from_numpy(np.stack([b.pixels for b in batch])).to(engine.device)
    raw = engine(normalise(pixels, engine.input_dtype))
    raw = raw.float().cpu().numpy()  # .cpu() waits for this stream's work
    return postprocess(raw, [b.geometry for b in batch], thresholds)


def int8_accuracy_report(
    int8_engine: Path | TensorRTEngine,
    fp16_engine: Path | TensorRTEngine,
    clips: Sequence[Path],
    *,
    frames_per_clip: int = 64,
    every: int = 5,
    thresholds: Thresholds | None = None,
    iou_threshold: float = 0.5,
) -> Int8AccuracyReport:
    """Run both engines over letterboxed frames of ``clips``; match INT8 boxes to FP16 boxes."""
    thresholds = thresholds or Thresholds()
    given = (int8_engine, fp16_engine)
    opened = [e if isinstance(e, TensorRTEngine) else TensorRTEngine(e) for e in given]
    int8, fp16 = opened
    try:
        if int8.imgsz != fp16.imgsz:
            raise ValueError(f"input sizes differ: int8 {int8.imgsz}, fp16 {fp16.imgsz}")
        batch_size = min(int8.opt_batch, fp16.opt_batch)
        letterbox = Letterbox(width=int8.imgsz[1], height=int8.imgsz[0])
        frames = letterboxed_frames(clips, letterbox, frames_per_clip=frames_per_clip, every=every)
        reference: list[ImageDetections] = []
        candidate: list[ImageDetections] = []
        batch: list[Letterboxed] = []
        for frame in frames:
            batch.append(frame)
            if len(batch) == batch_size:
                reference += _detect(fp16, batch, thresholds)
                candidate += _detect(int8, batch, thresholds)
                batch = []
        if batch and len(batch) >= max(int8.min_batch, fp16.min_batch):
            reference += _detect(fp16, batch, thresholds)
            candidate += _detect(int8, batch, thresholds)
        return compare_detections(reference, candidate, iou_threshold=iou_threshold)
    finally:
        for engine, argument in zip(opened, given, strict=True):
            if engine is not argument:
                engine.close()  # only the ones opened here
