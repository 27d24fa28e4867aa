"""The host side of the TensorRT build: input normalisation, calibration batches, metadata,
INT8-vs-FP16 matching, clip frames. Pure Python and PyAV: these run on any machine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from detectors.backends import takes_any_size
from detectors.postprocess import ImageDetections
from detectors.preprocess import Letterbox, to_network_input
from detectors.tensorrt.build import (
    Int8AccuracyReport,
    calibration_batches,
    compare_detections,
    engine_metadata,
    letterboxed_frames,
    onnx_metadata,
    profile_shapes,
)
from detectors.tensorrt.engine_file import read_engine_file, write_engine_file

RNG = np.random.default_rng(7)


def images(count: int, size: tuple[int, int] = (32, 48)) -> list[np.ndarray]:
    return [RNG.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(count)]


def test_network_input_is_rgb_nchw_in_unit_range() -> None:
    batch = np.stack(images(2))
    tensor = to_network_input(batch)
    assert tensor.dtype == np.float32 and tensor.flags.c_contiguous
    assert tensor.shape == (2, 3, 32, 48)
    for channel, bgr_index in enumerate((2, 1, 0)):  # R, G, B planes from B, G, R
        np.testing.assert_allclose(tensor[:, channel], batch[..., bgr_index] / 255.0, rtol=1e-6)


def test_calibration_batches_are_full_opt_batches() -> None:
    frames = images(10)
    batches = list(calibration_batches(iter(frames), 4, (32, 48)))
    assert len(batches) == 2  # the last 2 images do not fill a batch
    np.testing.assert_array_equal(batches[1], to_network_input(np.stack(frames[4:8])))


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((32, 48, 3), np.float32),
        np.zeros((48, 32, 3), np.uint8),
        np.zeros((32, 48), np.uint8),
    ],
)
def test_calibration_rejects_images_not_letterboxed_to_the_input(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="letterboxed 32x48x3 uint8"):
        list(calibration_batches([*images(1), bad], 4, (32, 48)))


def detections(
    boxes: list[list[float]], scores: list[float], classes: list[int]
) -> ImageDetections:
    return ImageDetections(
        np.asarray(boxes, np.float32).reshape(-1, 4),
        np.asarray(scores, np.float32),
        np.asarray(classes, np.int64),
    )


BOX = [100.0, 100.0, 200.0, 200.0]
NEAR = [105.0, 100.0, 205.0, 200.0]  # IoU 0.905 with BOX
FAR = [160.0, 100.0, 260.0, 200.0]  # IoU 0.25 with BOX


@pytest.mark.parametrize(
    ("reference", "candidate", "matched", "drop"),
    [
        (detections([BOX], [0.9], [0]), detections([BOX], [0.9], [0]), 1, 0.0),
        (detections([BOX], [0.9], [0]), detections([NEAR], [0.7], [0]), 1, 0.2),
        (detections([BOX], [0.9], [0]), detections([FAR], [0.9], [0]), 0, 0.0),  # IoU < 0.5
        (detections([BOX], [0.9], [0]), detections([BOX], [0.9], [2]), 0, 0.0),  # other class
        (detections([BOX], [0.9], [0]), detections([], [], []), 0, 0.0),
        # one candidate serves one reference box only, the higher-scoring one
        (detections([BOX, NEAR], [0.6, 0.8], [0, 0]), detections([NEAR], [0.7], [0]), 1, 0.1),
    ],
)
def test_compare_detections(
    reference: ImageDetections, candidate: ImageDetections, matched: int, drop: float
) -> None:
    report = compare_detections([reference], [candidate])
    assert report.matched == matched
    assert report.reference_boxes == len(reference)
    assert report.candidate_boxes == len(candidate)
    assert report.match_rate == pytest.approx(matched / len(reference))
    assert report.extra_boxes == len(candidate) - matched
    assert report.mean_score_drop == pytest.approx(drop, abs=1e-6)


def test_compare_detections_over_images() -> None:
    reference = [detections([BOX], [0.9], [0]), detections([BOX, FAR], [0.8, 0.5], [1, 1])]
    candidate = [detections([NEAR], [0.8], [0]), detections([BOX], [0.7], [1])]
    report = compare_detections(reference, candidate)
    assert (report.images, report.reference_boxes, report.candidate_boxes) == (2, 3, 2)
    assert report.matched == 2
    assert report.match_rate == pytest.approx(2 / 3)
    assert report.mean_score_drop == pytest.approx(0.1, abs=1e-6)
    assert report.max_score_drop == pytest.approx(0.1, abs=1e-6)
    with pytest.raises(ValueError, match="2 reference images but 1"):
        compare_detections(reference, candidate[:1])


def test_no_boxes_at_all_is_a_perfect_match() -> None:
    empty = detections([], [], [])
    assert compare_detections([empty], [empty]).match_rate == 1.0
    assert compare_detections([empty], [detections([BOX], [0.5], [0])]).match_rate == 0.0


def test_report_markdown() -> None:
    report = Int8AccuracyReport(
        images=12,
        reference_boxes=100,
        candidate_boxes=97,
        matched=95,
        mean_score_drop=0.0123,
        max_score_drop=0.2,
    )
    text = report.to_markdown()
    assert text.startswith("| int8 vs fp16 | value |\n|---|---:|\n")
    assert "| match rate | 95.0% |" in text
    assert "| int8 boxes without a match | 2 |" in text
    assert "| mean score drop | +0.0123 |" in text


def test_engine_metadata_from_ultralytics_onnx(assets: Path, tmp_path: Path) -> None:
    """ONNX metadata (Python literals in strings) becomes an Ultralytics-style JSON header."""
    base = onnx_metadata(assets / "models" / "yolov8n-coco_ultralytics_dynamic.onnx")
    header = engine_metadata(
        base,
        imgsz=(640, 640),
        min_batch=1,
        opt_batch=8,
        max_batch=16,
        half=True,
        int8=False,
        extra={"tensorrt": "10.x", "source": "m.onnx"},
    )
    json.dumps(header)  # JSON-ready
    assert header["stride"] == 32 and header["task"] == "detect"
    assert header["imgsz"] == [640, 640] and header["batch"] == 16
    assert header["args"]["dynamic"] is True and header["args"]["half"] is True
    read = write_engine_file(tmp_path / "m.engine", b"ftrt-engine-bytes", header)
    assert len(read.class_names) == 80 and read.class_names[:3] == ("person", "bicycle", "car")
    assert (read.min_batch, read.opt_batch, read.max_batch) == (1, 8, 16)
    assert (read.half, read.int8, read.imgsz) == (True, False, (640, 640))
    assert read_engine_file(read.path).metadata["framebatch"]["source"] == "m.onnx"
    # Ultralytics' loader: int.from_bytes(first 4 bytes, "little") then json.loads of that many.
    raw = read.path.read_bytes()
    length = int.from_bytes(raw[:4], byteorder="little")
    assert json.loads(raw[4 : 4 + length].decode("utf-8"))["names"]["0"] == "person"


def test_letterboxed_frames_from_clips(assets: Path) -> None:
    clips = [
        assets / "videos" / "street_night_1920x1080_3fps.mp4",  # 8 frames
        assets / "videos" / "indoor_person_768x432_10fps.mp4",
    ]
    frames = list(letterboxed_frames(clips, Letterbox(), frames_per_clip=3, every=3))
    assert len(frames) == 6  # street: frames 0, 3, 6; indoor: 0, 3, 6
    assert {f.pixels.shape for f in frames} == {(640, 640, 3)}
    assert [f.geometry.width for f in frames] == [1920] * 3 + [768] * 3


@pytest.mark.parametrize(
    ("rect", "low"),
    [(True, (1, 3, 32, 32)), (False, (1, 3, 640, 640))],
)
def test_a_rect_profile_spans_heights_and_widths(rect: bool, low: tuple) -> None:
    shapes = profile_shapes(
        min_batch=1, opt_batch=8, max_batch=32, height=640, width=640, rect=rect
    )
    assert shapes == (low, (8, 3, 640, 640), (32, 3, 640, 640))
    # the rectangles the decoders letterbox 16:9 and 4:3 frames to fit in the profile
    for height, width in ((384, 640), (480, 640), (640, 384)):
        shape = (8, 3, height, width)
        fits = all(lo <= d <= hi for lo, d, hi in zip(shapes[0], shape, shapes[2], strict=True))
        assert fits == rect


@pytest.mark.parametrize("rect", [True, False])
def test_the_engine_header_says_whether_it_is_rect(rect: bool, tmp_path: Path) -> None:
    header = engine_metadata(
        {},
        imgsz=(640, 640),
        min_batch=8,
        opt_batch=8,
        max_batch=8,
        half=True,
        int8=False,
        rect=rect,
    )
    assert header["args"]["dynamic"] is rect  # one batch size: dynamic only over H x W
    engine = write_engine_file(tmp_path / "m.engine", b"ftrt-engine-bytes", header)
    assert read_engine_file(engine.path).any_size is rect
    # the decoders read it without TensorRT, before the detector loads
    assert takes_any_size(engine.path) is rect
