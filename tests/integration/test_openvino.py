"""The OpenVINO backend against ONNX Runtime on the same model and frames: the same boxes
(same class, IoU >= 0.99) on the four clips at every batch size from 1 to 8, rectangular
batches of a model of any input size included, and a clear line where OpenVINO is missing."""

from __future__ import annotations

import sys

import pytest

from detectors.backends import load_backend, takes_any_size
from detectors.base import BackendUnavailable
from detectors.detector import Detector
from detectors.postprocess import Thresholds
from tests.conftest import MODEL, MODEL_ANY_SIZE
from tests.integration.matching import unmatched
from tests.integration.test_backends import CLIPS, labeled, sample_frames

pytestmark = pytest.mark.integration

FRAMES = 8  # of each clip: every batch size from 1 to 8 runs over them


@pytest.fixture(scope="module")
def frames(assets) -> dict[str, list]:
    return {clip: sample_frames(clip, FRAMES) for clip in CLIPS}


def detector(model, backend: str) -> Detector:
    return Detector(load_backend(model, backend, threads=2), thresholds=Thresholds())


def problems_against(expected: dict, actual: dict, what: str) -> list[str]:
    return [
        f"{what} {clip} #{index}: {problem}"
        for clip in CLIPS
        for index, (want, got) in enumerate(zip(expected[clip], actual[clip], strict=True))
        for problem in unmatched(labeled(want), labeled(got))
    ]


@pytest.mark.parametrize("rect", [False, True], ids=["square", "rect"])
def test_openvino_finds_what_onnxruntime_finds_at_every_batch_size(frames, rect):
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    model = MODEL_ANY_SIZE if rect else MODEL
    assert takes_any_size(model, "openvino") is rect
    reference = detector(model, "onnxruntime")
    expected = {
        clip: [reference.detect_frames([f], rect=rect)[0] for f in shots]
        for clip, shots in frames.items()
    }
    openvino = detector(model, "openvino")
    assert openvino.info.class_names[:3] == ("person", "bicycle", "car")  # the file's metadata
    problems = []
    for batch in range(1, 9):
        actual = {}
        for clip, shots in frames.items():
            actual[clip] = []
            for start in range(0, len(shots), batch):
                actual[clip] += openvino.detect_frames(shots[start : start + batch], rect=rect)
        problems += problems_against(expected, actual, f"batch {batch}")
    assert not problems, "\n".join(problems[:20])
    assert sum(len(found.boxes) for found in expected[CLIPS[0]]) > 20  # real boxes compared


def test_missing_openvino_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now fails
    with pytest.raises(BackendUnavailable, match=r"framebatch\[openvino\]"):
        load_backend(MODEL, "openvino")
