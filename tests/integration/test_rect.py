"""Rectangular inference (``model.rect``) end to end: cameras of three source aspects replayed
through the daemon with the Ultralytics-exported ONNX model (dynamic height and width).

Each frame is letterboxed to its minimum stride-aligned rectangle; frames of one shape share
batches and a batch never mixes shapes; every frame's detections equal the model run on that
frame alone, and Ultralytics' own ``predict(rect=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest

from detectors.backends import load_backend, takes_any_size
from detectors.detector import Detector
from detectors.postprocess import Thresholds
from pipeline.config import parse_config
from pipeline.supervisor.builders import frame_letterbox
from tests.conftest import MODEL, MODEL_ANY_SIZE, SAMPLE_CLIPS, VIDEOS
from tests.integration.matching import unmatched
from tests.integration.runner import published, run_until_done, write_config

pytestmark = [pytest.mark.integration]

SQUARE_FRAMES = 24


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]


@pytest.fixture(scope="module")
def square_clip(assets, tmp_path_factory) -> Path:
    """The highway clip cut to a 540x540 square (real traffic, a third aspect)."""
    path = tmp_path_factory.mktemp("square") / "highway_square.mp4"
    with av.open(str(VIDEOS / "highway_traffic_960x540_30fps.mp4")) as source:
        frames = [
            f.to_ndarray(format="bgr24")
            for _, f in zip(range(SQUARE_FRAMES), source.decode(video=0), strict=False)
        ]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width = stream.height = 540
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 4_000_000
        for image in frames:
            frame = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(image[:, 210:750]), format="bgr24"
            )
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


@pytest.fixture(scope="module")
def clips(square_clip) -> dict[str, Path]:
    return {
        "street": VIDEOS / "street_night_1920x1080_3fps.mp4",  # 16:9 -> 640x384
        "hw1080": VIDEOS / "highway_traffic_1920x1080_30fps_20frames.mp4",  # 16:9 -> 640x384
        "square": square_clip,  # 1:1 -> 640x640
        "bars": SAMPLE_CLIPS / "bars_320x240_5fps.mp4",  # 4:3 -> 640x480
    }


@pytest.fixture(scope="module")
def replay(clips, redis_url, redis_client_module, tmp_path_factory):
    config = write_config(
        tmp_path_factory.mktemp("rect") / "rect.yaml",
        model=MODEL_ANY_SIZE,
        cameras=[{"id": cam, "url": str(path)} for cam, path in clips.items()],
        redis_url=redis_url,
        prefix="rect",
        max_batch_size=4,
        # wait for full batches (of mixed shapes, split at dispatch), so cameras of one shape
        # surely meet in a batch whatever the decoders' timing
        max_wait_ms=300,
        batching_extra={"policy": "timeout"},
    )
    result = run_until_done(config)
    assert result.returncode == 0, result.stderr
    return {cam: published(redis_client_module, "rect", cam) for cam in clips}


@pytest.fixture(scope="module")
def detector(assets):
    detector = Detector(load_backend(MODEL_ANY_SIZE, threads=2), thresholds=Thresholds())
    yield detector
    detector.close()


def boxes(result) -> list:
    return [
        (tuple(map(float, b)), int(c)) for b, c in zip(result.boxes, result.class_ids, strict=True)
    ]


def test_rect_is_on_by_default_only_where_the_model_takes_any_size(assets, tmp_path):
    assert takes_any_size(MODEL_ANY_SIZE) and not takes_any_size(MODEL)

    def config(model: Path, **fields):
        data = {"model": {"path": str(model), **fields}, "cameras": [{"id": "a", "url": "a.mp4"}]}
        return parse_config(data, base_dir=tmp_path)

    assert frame_letterbox(config(MODEL_ANY_SIZE)).rect
    assert not frame_letterbox(config(MODEL_ANY_SIZE, rect=False)).rect
    assert not frame_letterbox(config(MODEL)).rect
    with pytest.raises(
        ValueError, match="model.rect is true but yolov8n_fp32_dynbatch.onnx takes 640x640"
    ):
        frame_letterbox(config(MODEL, rect=True))
    # square frames need nothing from the model file: a decode-only host may lack the model
    placeholder = tmp_path / "elsewhere.onnx"
    placeholder.write_bytes(b"not read")
    square = frame_letterbox(config(placeholder, rect=False, imgsz=320))
    assert not square.rect and (square.height, square.width) == (320, 320)


def test_every_frame_equals_the_model_run_on_it_alone(replay, clips, detector):
    problems = []
    for cam, path in clips.items():
        frames = decode(path)
        assert [m.seq for m in replay[cam]] == list(range(len(frames))), cam
        for message, frame in zip(replay[cam], frames, strict=True):
            (alone,) = detector.detect_frames([frame], rect=True)
            got = [(d.box, d.class_id) for d in message.detections]
            problems += [f"{cam} seq {message.seq}: {p}" for p in unmatched(boxes(alone), got)]
    assert problems == []
    assert sum(len(m.detections) for m in replay["square"]) > SQUARE_FRAMES  # real content


def test_batches_hold_one_shape_and_mix_cameras_of_that_shape(replay):
    shape_of = {
        "street": (640, 384),
        "hw1080": (640, 384),
        "square": (640, 640),
        "bars": (640, 480),
    }
    shapes: dict[int, set] = {}
    cameras: dict[int, set] = {}
    for cam, messages in replay.items():
        for m in messages:
            shapes.setdefault(m.batch_id, set()).add(shape_of[cam])
            cameras.setdefault(m.batch_id, set()).add(cam)
            assert 1 <= m.batch_size <= 4
    assert all(len(s) == 1 for s in shapes.values())
    assert any(cams == {"street", "hw1080"} for cams in cameras.values())


def test_detections_equal_ultralytics_predict_rect(replay, clips):
    """The peer on the same frames and model: YOLO.predict(rect=True), one frame at a time."""
    ultralytics = pytest.importorskip("ultralytics", reason="the ultralytics extra")
    model = ultralytics.YOLO(str(MODEL_ANY_SIZE), task="detect")
    problems = []
    for cam in ("street", "square"):
        for message, frame in zip(replay[cam], decode(clips[cam]), strict=True):
            (result,) = model.predict(
                frame, rect=True, conf=0.25, iou=0.45, imgsz=640, verbose=False
            )
            assert result.orig_shape == frame.shape[:2]
            expected = [
                (tuple(map(float, b)), int(c))
                for b, c in zip(result.boxes.xyxy.tolist(), result.boxes.cls.tolist(), strict=True)
            ]
            got = [(d.box, d.class_id) for d in message.detections]
            problems += [f"{cam} seq {message.seq}: {p}" for p in unmatched(expected, got)]
    assert problems == []


def test_the_bench_times_the_detector_on_the_shape_the_pipeline_runs(assets, tmp_path):
    """``framebatch bench`` with a rect model: both sides on 640x384 frames, every frame."""
    from tests.integration.runner import framebatch

    config = write_config(
        tmp_path / "bench.yaml",
        model=MODEL_ANY_SIZE,
        cameras=[{"id": "street", "url": str(VIDEOS / "street_night_1920x1080_3fps.mp4")}],
        redis_url=None,
        max_batch_size=4,
    )
    output = tmp_path / "bench.json"
    proc = framebatch(
        "bench",
        "--config",
        str(config),
        "--batch-sizes",
        "1,4",
        "--repeats",
        "1",
        "--output",
        str(output),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(output.read_text())
    assert report["input_shape"] == [384, 640]
    (round_,) = report["rounds"]
    assert round_["pipeline"]["processed"] == 8 and round_["pipeline"]["dropped"] == 0
    assert set(round_["alone"]) == {"1", "4"}
    # the stage costs travel as the pipeline's frames do: the default transport on this host
    assert report["transport"] == "shm"
    assert "frame shm encode + XLEN + XADD (640x384x3)" in proc.stdout
