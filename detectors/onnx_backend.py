"""ONNX Runtime backend: the whole batch in one ``session.run`` on the dynamic batch axis."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from detectors.base import BackendUnavailable, ModelInfo

COCO_FALLBACK_CLASSES = 80


def _class_names(metadata: dict[str, str], class_count: int) -> tuple[str, ...]:
    """Class names from Ultralytics' ``names`` metadata (a Python dict literal), else numbers."""
    raw = metadata.get("names")
    if raw:
        try:
            names = ast.literal_eval(raw)
            return tuple(str(names[i]) for i in range(len(names)))
        except (ValueError, SyntaxError, KeyError):
            pass  # malformed metadata: fall back to numeric labels below
    return tuple(str(i) for i in range(class_count))


class OnnxRuntimeBackend:
    """YOLOv8 ONNX model on ONNX Runtime (CPU provider here; CUDA when installed and asked for)."""

    name = "onnxruntime"

    def __init__(
        self, path: Path, *, imgsz: int = 640, threads: int | None = None, device: str = "cpu"
    ):
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
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        model_input = self._session.get_inputs()[0]
        self._input_name = model_input.name
        _, _, height, width = model_input.shape
        height = height if isinstance(height, int) else imgsz
        width = width if isinstance(width, int) else imgsz
        batch = model_input.shape[0]
        output_rows = self._session.get_outputs()[0].shape[1]
        class_count = output_rows - 4 if isinstance(output_rows, int) else COCO_FALLBACK_CLASSES
        metadata = self._session.get_modelmeta().custom_metadata_map
        self.info = ModelInfo(
            path=str(path),
            backend=self.name,
            input_width=width,
            input_height=height,
            class_names=_class_names(metadata, class_count),
            min_batch=batch if isinstance(batch, int) else 1,
            max_batch=batch if isinstance(batch, int) else None,
        )

    def prepare(self, images: np.ndarray) -> np.ndarray:
        """uint8 NHWC BGR -> float32 NCHW RGB in [0, 1] (a new array: it crosses threads)."""
        batch, height, width, _ = images.shape
        tensor = np.empty((batch, 3, height, width), np.float32)
        for channel in range(3):  # per-channel writes: half the cost of one strided astype
            np.divide(images[..., 2 - channel], 255.0, out=tensor[:, channel], dtype=np.float32)
        return tensor

    def infer(self, prepared: np.ndarray) -> np.ndarray:
        (output,) = self._session.run(None, {self._input_name: prepared})
        return output

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        for size in batch_sizes:
            blank = np.full((size, self.info.input_height, self.info.input_width, 3), 114, np.uint8)
            self.infer(self.prepare(blank))

    def close(self) -> None:
        self._session = None
