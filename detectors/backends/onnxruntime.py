"""ONNX Runtime: the whole batch in one ``session.run`` on the dynamic batch axis; the core
backend (the CPU provider here, CUDA and TensorRT providers with ``onnxruntime-gpu``)."""

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
    suffixes=(".onnx",),
    # an ONNX model is a protobuf whose first field is ir_version (tag 0x08)
    magic=b"\x08",
    file_kind="an ONNX model (protobuf)",
    rect=True,
    cpu_instances=True,
)
COCO_FALLBACK_CLASSES = 80


def open_backend(path: Path, options: BackendOptions) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(path, options)


def input_size(path: Path) -> tuple[int | None, int | None]:
    """(height, width) of the model's input, None where the axis is dynamic, read without
    optimising the graph (~60 ms for YOLOv8n, against seconds for a full load)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # ORT's pybind errors derive from Exception only
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ValueError(f"ONNX Runtime cannot load {path.name}: {detail}") from None
    shape = session.get_inputs()[0].shape
    height, width = (shape[2], shape[3]) if len(shape) == 4 else (None, None)
    return (height if isinstance(height, int) else None, width if isinstance(width, int) else None)


class OnnxRuntimeBackend:
    """YOLOv8 ONNX model on ONNX Runtime (CPU provider here; CUDA when installed and asked for)."""

    name = "onnxruntime"

    def __init__(self, path: Path, options: BackendOptions | None = None):
        options = options or BackendOptions()
        imgsz, threads = options.imgsz, options.threads
        device_kind, device_index = parse_device(options.device)
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - core dependency
            raise BackendUnavailable(
                "onnxruntime is not installed: pip install onnxruntime"
            ) from exc
        options = ort.SessionOptions()
        # Spinning workers burn the cores the decoders and the batcher need (measured: ~17 %
        # slower inference inside the pipeline with spinning on); block instead.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        providers = self._providers(ort.get_available_providers(), device_kind, device_index)
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=options, providers=providers
            )
        except Exception as exc:  # ORT's pybind errors derive from Exception only
            detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise ValueError(f"ONNX Runtime cannot load {path.name}: {detail}") from None
        model_input = self._session.get_inputs()[0]
        self._input_name = model_input.name
        _, _, height, width = model_input.shape
        any_size = not isinstance(height, int) and not isinstance(width, int)
        height = height if isinstance(height, int) else imgsz
        width = width if isinstance(width, int) else imgsz
        batch = model_input.shape[0]
        output_rows = self._session.get_outputs()[0].shape[1]
        class_count = output_rows - 4 if isinstance(output_rows, int) else COCO_FALLBACK_CLASSES
        metadata = self._session.get_modelmeta().custom_metadata_map
        try:
            names = class_names(metadata.get("names"), class_count)
        except ValueError as exc:
            raise ValueError(f"{path.name}: malformed model metadata: {exc}") from None
        self.info = ModelInfo(
            path=str(path),
            backend=self.name,
            input_width=width,
            input_height=height,
            class_names=names,
            min_batch=batch if isinstance(batch, int) else 1,
            max_batch=batch if isinstance(batch, int) else None,
            any_size=any_size,
            warms_per_size=device_kind != "cpu",
        )

    @staticmethod
    def _providers(available: list[str], device_kind: str, device_index: int | None) -> list[Any]:
        """CPU here; on ``cuda:N`` TensorRT then CUDA first when this onnxruntime build has them."""
        if device_kind == "cpu":
            return ["CPUExecutionProvider"]
        gpu = [p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p in available]
        if not gpu:
            raise BackendUnavailable(
                f"device {device_kind}:{device_index} asked for, but this onnxruntime has no CUDA "
                f"provider (available: {', '.join(available)}): pip install onnxruntime-gpu"
            )
        return [(p, {"device_id": device_index}) for p in gpu] + ["CPUExecutionProvider"]

    def prepare(self, images: Sequence[np.ndarray]) -> np.ndarray:
        return to_network_input(images)

    def infer(self, prepared: np.ndarray) -> BatchOutput:
        (output,) = self._session.run(None, {self._input_name: prepared})
        return BatchOutput(raw=output)

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        for size in batch_sizes:
            blank = np.full((self.info.input_height, self.info.input_width, 3), 114, np.uint8)
            self.infer(self.prepare([blank] * size))

    def close(self) -> None:
        self._session = None
