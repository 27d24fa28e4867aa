"""How many instances of the model a detector worker loads, and with how many threads each."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from detectors.base import ModelInfo
from detectors.detector import Detector
from detectors.postprocess import Thresholds
from pipeline.config import parse_config
from pipeline.supervisor.builders import inference_instances, run_shape
from tests.unit.test_config import MINIMAL, merged


def config_with(model: dict[str, Any]):
    return parse_config(merged(MINIMAL, {"model": model}), base_dir=".")


@pytest.mark.parametrize(
    ("model", "device", "expected"),
    [
        # unset: ONNX Runtime on a CPU splits its threads between two sessions
        ({"path": "m.onnx", "threads": 2}, "cpu", (2, 1)),
        ({"path": "m.onnx", "threads": 8}, "cpu", (2, 4)),
        ({"path": "m.onnx", "threads": 7}, "cpu", (2, 3)),
        ({"path": "m.onnx", "threads": 1}, "cpu", (1, 1)),  # one thread: one session
        ({"path": "m.onnx", "threads": 2}, "cuda:0", (1, 2)),  # the device runs one at a time
        ({"path": "m.torchscript", "threads": 2}, "cpu", (1, 2)),  # torch: one pool per process
        ({"path": "m.pt", "threads": 4}, "cpu", (1, 4)),
        # set: as asked
        ({"path": "m.onnx", "threads": 2, "instances": 1}, "cpu", (1, 2)),
        ({"path": "m.onnx", "instances": 1}, "cpu", (1, None)),  # ONNX Runtime's own default
        ({"path": "m.onnx", "threads": 6, "instances": 3}, "cpu", (3, 2)),
        ({"path": "m.torchscript", "threads": 4, "instances": 2}, "cpu", (2, 2)),
    ],
)
def test_instances_and_threads_each(model, device, expected):
    assert inference_instances(config_with(model), device) == expected


def info(any_size: bool) -> ModelInfo:
    return ModelInfo("m.onnx", "onnxruntime", 640, 640, ("thing",), any_size=any_size)


@pytest.mark.parametrize(
    ("rect", "any_size", "shape"),
    [
        (None, True, (384, 640)),  # unset: rect where the model takes any size
        (None, False, (640, 640)),
        (True, True, (384, 640)),
        (False, True, (640, 640)),  # square asked for
    ],
)
def test_warm_up_and_timing_use_the_shape_the_pipeline_runs(rect, any_size, shape):
    config = config_with({"path": "m.onnx", "rect": rect})
    assert run_shape(config, info(any_size)) == shape


class FakeWarmingBackend:
    """Notes whether its warm-up met the other instance's (both inside ``warmup`` at once)."""

    def __init__(self, together: threading.Barrier, *, warms_alone: bool = False):
        self.info = replace(info(False), warms_alone=warms_alone)
        self._together = together
        self.met: bool | None = None

    def warmup(self, batch_sizes) -> None:
        try:
            self._together.wait()
            self.met = True
        except threading.BrokenBarrierError:  # the other one did not come meanwhile
            self.met = False


def test_instances_warm_up_side_by_side():
    together = threading.Barrier(2, timeout=60)
    first, second = (FakeWarmingBackend(together) for _ in range(2))
    Detector(first, thresholds=Thresholds(), instances=[second]).warmup([1])
    assert first.met and second.met


def test_instances_that_capture_cuda_graphs_warm_up_one_after_another():
    """A CUDA graph capture fails when another thread works on the device meanwhile: the first
    instance waits 2 s for the second inside its warm-up, and never meets it."""
    together = threading.Barrier(2, timeout=2)
    first = FakeWarmingBackend(together, warms_alone=True)
    second = FakeWarmingBackend(together)
    Detector(first, thresholds=Thresholds(), instances=[second]).warmup([1])
    assert (first.met, second.met) == (False, False)
