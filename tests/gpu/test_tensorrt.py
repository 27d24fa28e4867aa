"""TensorRT: build engines from the shared ONNX model, run them on torch CUDA tensors, and hold
them to the ONNX Runtime backend. Skipped (with the reason) without TensorRT 10 or a CUDA GPU;
only the missing-TensorRT error message is checked everywhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detectors.backends.onnxruntime import OnnxRuntimeBackend
from detectors.base import BackendUnavailable
from detectors.postprocess import Thresholds, postprocess
from detectors.preprocess import Letterbox
from detectors.tensorrt.build import (
    build_engine,
    compare_detections,
    int8_accuracy_report,
    letterboxed_frames,
)
from detectors.tensorrt.engine import TensorRTEngine
from detectors.tensorrt.engine_file import read_engine_file

pytestmark = [pytest.mark.gpu]

HAVE_TENSORRT = importlib.util.find_spec("tensorrt") is not None
OPT_BATCH, MAX_BATCH = 4, 8
CONFIDENT = 0.25  # postprocess' default confidence


def model(assets: Path) -> Path:
    return assets / "models" / "yolov8n_fp32_dynbatch.onnx"


def clips(assets: Path) -> list[Path]:
    return sorted((assets / "videos").glob("*.mp4"))


@pytest.mark.skipif(HAVE_TENSORRT, reason="TensorRT is installed here")
def test_without_tensorrt_the_error_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable) as caught:
        TensorRTEngine(tmp_path / "yolov8n.engine")
    message = str(caught.value)
    assert "pip install tensorrt" in message
    assert "container" in message
    assert ".onnx" in message and ".torchscript" in message
    with pytest.raises(BackendUnavailable, match="pip install tensorrt"):
        build_engine(tmp_path / "m.onnx", tmp_path / "m.engine", opt_batch=1, max_batch=1)


@pytest.fixture(scope="module")
def torch() -> Any:
    pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install tensorrt)")
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the TensorRT tests need an NVIDIA GPU")
    return torch


@pytest.fixture(scope="module")
def engines(torch: Any, assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """FP32 and FP16 engines, batch 1..8 (opt 4), built once; a shared timing cache."""
    folder = tmp_path_factory.mktemp("engines")
    timing = folder / "timing.cache"
    built = {"timing": timing}
    for name, half in (("fp32", False), ("fp16", True)):
        built[name] = build_engine(
            model(assets),
            folder / f"{name}.engine",
            opt_batch=OPT_BATCH,
            max_batch=MAX_BATCH,
            half=half,
            timing_cache=timing,
            workspace_gib=2,
        )
    return built


@pytest.fixture(scope="module")
def frames(assets: Path) -> list:
    """Eight real letterboxed frames, two from each clip."""
    return list(letterboxed_frames(clips(assets), Letterbox(), frames_per_clip=2, every=4))


@pytest.fixture(scope="module")
def onnx_raw(assets: Path, frames: list) -> np.ndarray:
    backend = OnnxRuntimeBackend(model(assets))
    try:
        return backend.infer(backend.prepare(np.stack([f.pixels for f in frames]))).raw
    finally:
        backend.close()


def to_device(torch: Any, frames: list, engine: TensorRTEngine) -> Any:
    pixels = torch.from_numpy(np.stack([f.pixels for f in frames])).to(engine.device)
    images = pixels.permute(0, 3, 1, 2).flip(1).to(engine.input_dtype) / 255
    return images.contiguous()


def run(torch: Any, engine: TensorRTEngine, frames: list) -> np.ndarray:
    return engine(to_device(torch, frames, engine)).float().cpu().numpy()


def test_engine_file_has_ultralytics_header(engines: dict[str, Path], torch: Any) -> None:
    import tensorrt

    for name in ("fp32", "fp16"):
        read = read_engine_file(engines[name])
        assert read.has_header and read.engine_size > 1_000_000
        assert len(read.class_names) == 80 and read.class_names[0] == "person"
        assert read.imgsz == (640, 640)
        assert (read.min_batch, read.opt_batch, read.max_batch) == (1, OPT_BATCH, MAX_BATCH)
        assert (read.half, read.int8) == (name == "fp16", False)
        assert read.metadata["stride"] == 32  # carried over from the ONNX model's metadata
        assert read.metadata["framebatch"]["tensorrt"] == tensorrt.__version__
    assert engines["timing"].stat().st_size > 0


def test_engine_facts(engines: dict[str, Path], torch: Any) -> None:
    fp32, fp16 = TensorRTEngine(engines["fp32"]), TensorRTEngine(engines["fp16"])
    for engine in (fp32, fp16):
        assert (engine.min_batch, engine.opt_batch, engine.max_batch) == (1, OPT_BATCH, MAX_BATCH)
        assert engine.imgsz == (640, 640)
        assert engine.class_names[:3] == ("person", "bicycle", "car")
        assert engine.output_dtype == torch.float32
    assert fp32.input_dtype == torch.float32
    assert fp16.input_dtype == torch.float16


@pytest.mark.parametrize(("name", "min_match"), [("fp32", 0.97), ("fp16", 0.95)])
def test_parity_with_onnx_runtime(
    engines: dict[str, Path],
    torch: Any,
    frames: list,
    onnx_raw: np.ndarray,
    name: str,
    min_match: float,
) -> None:
    engine = TensorRTEngine(engines[name])
    raw = run(torch, engine, frames)
    assert raw.shape == onnx_raw.shape == (len(frames), 84, 8400)
    confident = onnx_raw[:, 4:].max(axis=1) > CONFIDENT  # (N, anchors)
    assert confident.sum() > 20  # the frames hold real objects
    box_error = np.abs(raw[:, :4] - onnx_raw[:, :4]).transpose(0, 2, 1)[confident]
    score_error = np.abs(raw[:, 4:] - onnx_raw[:, 4:]).transpose(0, 2, 1)[confident]
    # FP32 engines use TF32 by default (TensorRT), hence not bit-exact.
    assert box_error.max() < (1.0 if name == "fp32" else 3.0)  # pixels of the 640 input
    assert score_error.max() < (0.01 if name == "fp32" else 0.03)
    geometries = [f.geometry for f in frames]
    report = compare_detections(
        postprocess(onnx_raw, geometries, Thresholds()), postprocess(raw, geometries, Thresholds())
    )
    assert report.reference_boxes > 20
    assert report.match_rate >= min_match, report.to_markdown()
    assert abs(report.mean_score_drop) < 0.01


def test_batching_does_not_change_results(
    engines: dict[str, Path], torch: Any, frames: list
) -> None:
    engine = TensorRTEngine(engines["fp32"])
    batched = run(torch, engine, frames)
    alone = np.concatenate([run(torch, engine, [frame]) for frame in frames])
    # Kernels may differ per batch size (TF32 is on by default): equal up to rounding.
    confident = batched[:, 4:].max(axis=1) > CONFIDENT
    np.testing.assert_allclose(alone[:, 4:], batched[:, 4:], atol=5e-3)
    boxes_alone = alone[:, :4].transpose(0, 2, 1)[confident]
    boxes_batched = batched[:, :4].transpose(0, 2, 1)[confident]
    np.testing.assert_allclose(boxes_alone, boxes_batched, atol=1.0)
    geometries = [f.geometry for f in frames]
    report = compare_detections(
        postprocess(alone, geometries, Thresholds()),
        postprocess(batched, geometries, Thresholds()),
    )
    assert report.match_rate >= 0.98, report.to_markdown()


def test_runs_on_the_callers_stream(
    engines: dict[str, Path], torch: Any, frames: list, onnx_raw: np.ndarray
) -> None:
    """The input is written on a side stream after a GPU sleep: an engine that ran on any other
    stream would read the zeros that were there before and miss every object."""
    engine = TensorRTEngine(engines["fp32"])
    ready = to_device(torch, frames, engine)
    images = torch.zeros_like(ready)
    torch.cuda.synchronize()
    side = torch.cuda.Stream(device=engine.device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued before the copy
        images.copy_(ready)
        output = engine(images).clone()
    side.synchronize()
    raw = output.cpu().numpy()
    confident = onnx_raw[:, 4:].max(axis=1) > CONFIDENT
    scores = raw[:, 4:].transpose(0, 2, 1)[confident]
    expected = onnx_raw[:, 4:].transpose(0, 2, 1)[confident]
    np.testing.assert_allclose(scores, expected, atol=0.01)


def test_output_buffers_are_cached_per_batch_size(
    engines: dict[str, Path], torch: Any, frames: list
) -> None:
    engine = TensorRTEngine(engines["fp16"])
    four = to_device(torch, frames[:4], engine)
    first, again = engine(four), engine(four)
    assert first.data_ptr() == again.data_ptr()
    assert first.shape == (4, 84, 8400)
    two = engine(to_device(torch, frames[:2], engine))
    assert two.shape == (2, 84, 8400) and two.data_ptr() != first.data_ptr()
    assert engine(four).data_ptr() == first.data_ptr()  # back to 4: the same buffer


def test_rejects_what_the_engine_cannot_run(
    engines: dict[str, Path], torch: Any, frames: list
) -> None:
    engine = TensorRTEngine(engines["fp16"])
    too_many = to_device(torch, frames * 2, engine)[: MAX_BATCH + 1].clone()  # 9 images
    assert too_many.shape[0] == MAX_BATCH + 1
    with pytest.raises(ValueError, match=r"batch of 9 is outside .*\(1\.\.8\)"):
        engine(too_many)
    with pytest.raises(TypeError, match="float16"):
        engine(to_device(torch, frames[:1], engine).float())
    with pytest.raises(ValueError, match=r"expected images \(N, 3, 640, 640\)"):
        engine(torch.zeros((1, 3, 320, 320), dtype=torch.float16, device=engine.device))
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine(torch.zeros((1, 3, 640, 640), dtype=torch.float16, device=engine.device))
    engine.close()  # legal twice


def test_parser_errors_name_the_file(torch: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an onnx protobuf")
    with pytest.raises(RuntimeError, match=r"could not parse .*broken\.onnx"):
        build_engine(broken, tmp_path / "b.engine", opt_batch=1, max_batch=2, metadata={})


@pytest.mark.slow
def test_int8_calibration_cache_and_accuracy_report(
    engines: dict[str, Path], torch: Any, assets: Path, tmp_path: Path
) -> None:
    calibration = [
        f.pixels
        for f in letterboxed_frames(clips(assets), Letterbox(), frames_per_clip=32, every=3)
    ]
    cache = tmp_path / "int8.calibration-cache"
    int8 = build_engine(
        model(assets),
        tmp_path / "int8.engine",
        opt_batch=OPT_BATCH,
        max_batch=MAX_BATCH,
        half=True,
        int8=True,
        calibration_images=calibration,
        calibration_cache=cache,
        timing_cache=engines["timing"],
        workspace_gib=2,
    )
    assert cache.stat().st_size > 0
    read = read_engine_file(int8)
    assert (read.int8, read.half) == (True, True)
    assert TensorRTEngine(int8).input_dtype == torch.float32  # INT8 builds keep the FP32 input

    report = int8_accuracy_report(int8, engines["fp16"], clips(assets), frames_per_clip=8, every=7)
    assert report.images == 21 and report.reference_boxes > 20
    # A sanity floor, not a quality bar: a broken calibration matches almost nothing.
    assert report.match_rate >= 0.5, report.to_markdown()
    assert abs(report.mean_score_drop) < 0.15, report.to_markdown()
    assert "| match rate |" in report.to_markdown()

    # The cache alone is enough to rebuild (no images): TensorRT skips calibration.
    again = build_engine(
        model(assets),
        tmp_path / "int8-from-cache.engine",
        opt_batch=OPT_BATCH,
        max_batch=MAX_BATCH,
        int8=True,
        calibration_cache=cache,
        timing_cache=engines["timing"],
        workspace_gib=2,
    )
    engine = TensorRTEngine(again)
    frames = list(letterboxed_frames(clips(assets)[:1], Letterbox(), frames_per_clip=2, every=5))
    assert run(torch, engine, frames).shape == (2, 84, 8400)


def test_a_rect_engine_runs_the_rectangles_onnx_runtime_runs(
    torch: Any, assets: Path, tmp_path: Path
) -> None:
    """An engine built with ``rect`` takes the decoders' 640x384 letterbox of a 16:9 clip (and
    the square), with ONNX Runtime's detections on the same dynamic-size model."""
    dynamic = assets / "models" / "yolov8n-coco_ultralytics_dynamic.onnx"
    path = build_engine(
        dynamic,
        tmp_path / "rect.engine",
        rect=True,
        opt_batch=OPT_BATCH,
        max_batch=MAX_BATCH,
        half=False,
        workspace_gib=2,
    )
    assert read_engine_file(path).any_size
    engine = TensorRTEngine(path)
    assert engine.any_size and engine.imgsz == (640, 640)
    highway = [clip for clip in clips(assets) if clip.name.startswith("highway")]
    frames = list(letterboxed_frames(highway, Letterbox(rect=True), frames_per_clip=4, every=4))
    assert frames[0].pixels.shape == (384, 640, 3)
    backend = OnnxRuntimeBackend(dynamic)
    try:
        reference = backend.infer(backend.prepare(np.stack([f.pixels for f in frames]))).raw
    finally:
        backend.close()
    raw = run(torch, engine, frames)
    assert raw.shape == reference.shape == (4, 84, 5040)  # 384x640 anchors, not 8400
    geometries = [f.geometry for f in frames]
    report = compare_detections(
        postprocess(reference, geometries, Thresholds()), postprocess(raw, geometries, Thresholds())
    )
    assert report.reference_boxes > 10
    assert report.match_rate >= 0.97, report.to_markdown()
    square = list(letterboxed_frames(highway, Letterbox(), frames_per_clip=1))
    assert run(torch, engine, square).shape == (1, 84, 8400)  # the square still runs
