"""OpenVINO on the CPU: an OpenVINO IR (``.xml`` beside its ``.bin``) or an ONNX model read
directly (``backend: openvino``), the whole batch in one inference on the dynamic batch axis.

The ``openvino`` extra. Against ONNX Runtime on this project's 2-core CPU it is faster at small
batches (the light load of a few cameras) and about equal at batch 8 (``docs/benchmarks.md``):
its CPU plugin compiles the graph for the machine's instruction set and keeps the compiled
kernels per input shape.  Compiled with the ``LATENCY`` hint and the configured threads, so two
instances side by side each keep to their own cores, as ONNX Runtime's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detectors.backends import BackendPlugin
from detectors.base import BackendOptions, BackendUnavailable, BatchOutput, ModelInfo, parse_device
from detectors.metadata import class_names
from detectors.preprocess import to_network_input

PLUGIN = BackendPlugin(
    suffixes=(".xml",),
    extra="openvino",
    magic=b"",  # an IR's XML or an ONNX protobuf: OpenVINO's own reader says which is wrong
    file_kind="an OpenVINO IR (.xml) or an ONNX model",
    rect=True,
    cpu_instances=True,
)
COCO_FALLBACK_CLASSES = 80
#: where Ultralytics' exports keep the class names: ONNX metadata (read as rt_info), IR rt_info
NAMES_AT = (("framework", "names"), ("model_info", "names"))


def open_backend(path: Path, options: BackendOptions) -> OpenVinoBackend:
    return OpenVinoBackend(path, options)


def _read(path: Path) -> Any:
    import openvino as ov

    try:
        return ov.Core().read_model(str(path))
    except RuntimeError as exc:  # OpenVINO's errors carry pages of C++ context
        detail = str(exc).strip().splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ValueError(f"OpenVINO cannot read {path.name}: {detail}") from None


def input_size(path: Path) -> tuple[int | None, int | None]:
    """(height, width) of the model's input, None where the axis is dynamic (read, not
    compiled)."""
    shape = _read(path).inputs[0].partial_shape
    if shape.rank.is_dynamic or shape.rank.get_length() != 4:
        return None, None
    height, width = shape[2], shape[3]
    return (
        None if height.is_dynamic else height.get_length(),
        None if width.is_dynamic else width.get_length(),
    )


def _names(model: Any, class_count: int) -> tuple[str, ...]:
    for where in NAMES_AT:
        try:
            value = model.get_rt_info(list(where)).astype(str)
        except (RuntimeError, KeyError):
            continue
        return class_names(value, class_count)
    return class_names(None, class_count)


class OpenVinoBackend:
    """A YOLOv8 model compiled for OpenVINO's CPU plugin."""

    name = "openvino"

    def __init__(self, path: Path, options: BackendOptions | None = None):
        options = options or BackendOptions()
        device_kind, device_index = parse_device(options.device)
        if device_kind != "cpu":
            raise BackendUnavailable(
                f"device {options.device} asked for: the openvino backend runs on the CPU here "
                "(Intel GPUs and NPUs are not wired in); use onnxruntime or torch on CUDA"
            )
        import openvino as ov

        model = _read(path)
        shape = model.inputs[0].partial_shape
        fixed = [None if d.is_dynamic else d.get_length() for d in shape]
        _, _, height, width = fixed if len(fixed) == 4 else (None, None, None, None)
        any_size = height is None and width is None
        rows = model.outputs[0].partial_shape[1]
        class_count = COCO_FALLBACK_CLASSES if rows.is_dynamic else rows.get_length() - 4
        try:
            names = _names(model, class_count)
        except ValueError as exc:
            raise ValueError(f"{path.name}: malformed model metadata: {exc}") from None
        # f32 on every CPU: where it has bf16 units the plugin would otherwise run in bf16,
        # and a frame's boxes would depend on the machine
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
        if options.threads is not None:
            config["INFERENCE_NUM_THREADS"] = options.threads
        try:
            self._compiled = ov.Core().compile_model(model, "CPU", config)
        except RuntimeError as exc:
            detail = str(exc).strip().splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise ValueError(f"OpenVINO cannot compile {path.name}: {detail}") from None
        self._request = self._compiled.create_infer_request()
        batch = fixed[0] if fixed else None
        self.info = ModelInfo(
            path=str(path),
            backend=self.name,
            input_width=width or options.imgsz,
            input_height=height or options.imgsz,
            class_names=names,
            min_batch=batch or 1,
            max_batch=batch,
            any_size=any_size,
        )

    def prepare(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return to_network_input(images)

    def infer(self, prepared: np.ndarray) -> BatchOutput:
        # one request per backend instance: ``infer`` is called from one thread at a time
        self._request.infer({0: prepared})
        return BatchOutput(raw=np.array(self._request.get_output_tensor(0).data, copy=True))

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        for size in batch_sizes:
            blank = np.full((self.info.input_height, self.info.input_width, 3), 114, np.uint8)
            self.infer(self.prepare([blank] * size))

    def close(self) -> None:
        self._request = None
        self._compiled = None
