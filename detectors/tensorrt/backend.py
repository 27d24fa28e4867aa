"""TensorRT engines (``.engine``, TensorRT 10), on the same device path as the torch backends.

The engine runs on the compute stream of :class:`DeviceRunner` (pinned slots, double-buffered
uploads, normalisation and NMS on the GPU); its input dtype (FP16 or FP32) is the engine's own.
Written against the TensorRT 10 Python API; it needs ``tensorrt``, torch with CUDA and a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from detectors.base import BackendOptions, ModelInfo
from detectors.device.backend import DeviceBackend, check_device
from detectors.tensorrt.engine import TensorRTEngine, import_tensorrt


class TensorRTBackend(DeviceBackend):
    """A serialized engine (plain, or with Ultralytics' JSON metadata header) on ``cuda:N``."""

    name = "tensorrt"

    def __init__(self, path: Path, options: BackendOptions | None = None):
        import_tensorrt()  # first: its absence is the error to report, not the CPU's
        options = options or BackendOptions(device="cuda:0")
        if options.device == "cpu":
            options = replace(options, device="cuda:0")
        engine = TensorRTEngine(path, device=str(check_device(options)))
        height, width = engine.imgsz
        info = ModelInfo(
            path=str(path),
            backend=self.name,
            input_width=width,
            input_height=height,
            class_names=engine.class_names,
            min_batch=engine.min_batch,
            max_batch=engine.max_batch,
            any_size=engine.any_size,
        )
        self._engine = engine
        # an engine already runs its own tuned kernels; graphs around enqueueV3 are left out
        super().__init__(
            info, engine, input_dtype=engine.input_dtype, options=options, graphs_allowed=False
        )

    def close(self) -> None:
        super().close()
        self._engine.close()
