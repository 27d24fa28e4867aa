"""The backend protocol every detector backend implements, and the model facts it reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from detectors.postprocess import InputDetections, Thresholds

#: How to install what each optional backend needs; named in BackendUnavailable messages.
EXTRAS = {
    "torch": "pip install 'framebatch[torch]'  (torch and torchvision)",
    "ultralytics": "pip install 'framebatch[ultralytics]'  (AGPL-3.0: torch + ultralytics)",
    "openvino": "pip install 'framebatch[openvino]'  (Intel's OpenVINO runtime, Apache-2.0)",
    "tensorrt": (
        "pip install tensorrt 'framebatch[torch]'  (TensorRT 10 for your CUDA version and a CUDA "
        "build of torch; or NVIDIA's container)"
    ),
}


class BackendUnavailable(RuntimeError):
    """An optional library a backend needs is not installed; the message names the extra."""


@dataclass(frozen=True)
class ModelInfo:
    """What the pipeline needs to know about a loaded model."""

    path: str
    backend: str
    input_width: int
    input_height: int
    class_names: tuple[str, ...]
    min_batch: int = 1
    max_batch: int | None = None  # None: no upper bound declared by the model
    # takes images of any stride-aligned height and width (rectangular inference), not only
    # input_width x input_height
    any_size: bool = False
    # the first run at each batch size is slower (kernels compiled or tuned per shape: OpenVINO,
    # CUDA); False where one run warms every size (ONNX Runtime's CPU provider: its first batch
    # of 8 takes as long as its second)
    warms_per_size: bool = True
    # warm-up captures CUDA graphs: a capture fails if another thread works on the device
    # meanwhile (``capture_error_mode="global"``), so instances warm up one after another
    warms_alone: bool = False

    def label(self, class_id: int) -> str:
        names = self.class_names
        return names[class_id] if 0 <= class_id < len(names) else str(class_id)


@dataclass(frozen=True)
class BatchOutput:
    """What every backend's ``infer`` returns for a batch: either the raw YOLOv8 head
    ``(N, 4 + classes, anchors)`` as float32 on the host, decoded and suppressed there
    (``raw``), or the boxes a device-side NMS kept for each image (``found``)."""

    raw: np.ndarray | None = None
    found: tuple[InputDetections, ...] | None = None

    def __post_init__(self) -> None:
        if (self.raw is None) == (self.found is None):
            raise ValueError("a batch output holds either the raw head or the kept boxes")

    def __len__(self) -> int:
        """Images in the batch."""
        return len(self.raw) if self.raw is not None else len(self.found or ())


def parse_device(device: str) -> tuple[str, int | None]:
    """``cpu`` -> ("cpu", None); ``cuda``/``cuda:N`` -> ("cuda", N); anything else: ValueError."""
    if device == "cpu":
        return "cpu", None
    if device == "cuda":
        return "cuda", 0
    kind, _, index = device.partition(":")
    if kind == "cuda" and index.isdigit():
        return "cuda", int(index)
    raise ValueError(f"unknown device {device!r} (expected cpu, cuda or cuda:N)")


@dataclass(frozen=True)
class BackendOptions:
    """How to run a model; each backend uses the options that apply to it."""

    imgsz: int = 640
    device: str = "cpu"  # cpu | cuda | cuda:N
    threads: int | None = None  # CPU intra-op threads (ONNX Runtime, torch on CPU)
    half: bool = False  # FP16 weights and input on CUDA (torch backends)
    max_batch: int = 32  # sizes the pinned buffer pool of the device path
    thresholds: Thresholds = field(default_factory=Thresholds)  # for NMS on the device
    nms: Literal["device", "host"] = "device"  # device path: NMS on the device or on the host
    double_buffer: bool = True  # device path: upload batch k+1 while batch k computes
    cuda_graphs: bool = False  # device path: capture one CUDA graph per warmed-up batch size


class Backend(Protocol):
    """A loaded model that runs a whole batch in one call.

    ``prepare`` turns letterboxed uint8 HxWx3 BGR images into the backend's input
    (normalisation, layout, upload); it is split from ``infer`` so the next batch can be
    prepared while this one runs. ``prepare`` and ``infer`` may run on two different threads
    (one each). ``infer`` returns a :class:`BatchOutput`.
    """

    info: ModelInfo

    def prepare(self, images: Sequence[np.ndarray]) -> Any: ...

    def infer(self, prepared: Any) -> BatchOutput: ...

    def warmup(self, batch_sizes: Sequence[int]) -> None: ...

    def close(self) -> None: ...
