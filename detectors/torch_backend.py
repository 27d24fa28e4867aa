"""PyTorch backends: TorchScript files (torch only), and the device path every torch-run model
shares (:class:`DeviceBackend`), which the Ultralytics ``.pt`` and TensorRT backends reuse."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detectors.base import BackendOptions, BackendUnavailable, ModelInfo, parse_device
from detectors.device_runner import DeviceModel, DeviceRunner, StagedBatch
from detectors.postprocess import InputDetections

COCO_CLASSES = 80


def class_names(names: Any, class_count: int = COCO_CLASSES) -> tuple[str, ...]:
    """Class names from Ultralytics metadata: a dict ``{id: name}`` (keys may be strings, as
    after a JSON round trip) or a list; numbers when absent."""
    if isinstance(names, Mapping) and names:
        by_id = {int(key): str(value) for key, value in names.items()}
        return tuple(by_id.get(i, str(i)) for i in range(max(by_id) + 1))
    if isinstance(names, list | tuple) and names:
        return tuple(str(name) for name in names)
    return tuple(str(i) for i in range(class_count))


def check_device(options: BackendOptions) -> torch.device:
    """The torch device of ``options.device``; a clear error when CUDA is asked for but absent."""
    kind, index = parse_device(options.device)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                f"device {options.device!r} asked for, but torch {torch.__version__} sees no "
                "CUDA device (a CPU build, or no driver): use device: cpu"
            )
        if index >= torch.cuda.device_count():
            raise BackendUnavailable(
                f"device {options.device!r} asked for, but only "
                f"{torch.cuda.device_count()} CUDA device(s) are visible"
            )
        return torch.device("cuda", index)
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    return torch.device("cpu")


class DeviceBackend:
    """A model run through :class:`DeviceRunner`: pinned slots, two streams, NMS on the device."""

    name = "torch"

    def __init__(
        self,
        info: ModelInfo,
        model: DeviceModel,
        *,
        input_dtype: torch.dtype,
        options: BackendOptions,
        graphs_allowed: bool = True,
    ):
        self.info = info
        max_batch = min(options.max_batch, info.max_batch or options.max_batch)
        self._runner = DeviceRunner(
            model,
            input_dtype=input_dtype,
            height=info.input_height,
            width=info.input_width,
            options=replace(options, max_batch=max_batch),
            graphs_allowed=graphs_allowed,
        )

    def prepare(self, images: Sequence[np.ndarray]) -> StagedBatch:
        return self._runner.stage(images)

    def infer(self, prepared: StagedBatch) -> np.ndarray | list[InputDetections]:
        return self._runner.run(prepared)

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        self._runner.warmup(batch_sizes)

    def close(self) -> None:
        self._runner.close()


class TorchScriptBackend(DeviceBackend):
    """A TorchScript YOLOv8 (``framebatch export --format torchscript`` or Ultralytics' own):
    needs torch only. Model facts come from the ``config.txt`` metadata stored in the file."""

    name = "torchscript"

    def __init__(self, path: Path, options: BackendOptions | None = None):
        options = options or BackendOptions()
        device = check_device(options)
        extra_files = {"config.txt": ""}
        module = torch.jit.load(str(path), map_location=device, _extra_files=extra_files)
        module.eval()
        metadata = json.loads(extra_files["config.txt"] or "{}")
        # FP16 on CUDA only (slow or missing kernels on the CPU); an FP16 export asks for it too
        half = (options.half or bool(metadata.get("half"))) and device.type == "cuda"
        if half:
            module.half()
        else:
            module.float()
        imgsz = metadata.get("imgsz") or [options.imgsz, options.imgsz]
        height, width = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
        info = ModelInfo(
            path=str(path),
            backend=self.name,
            input_width=int(width),
            input_height=int(height),
            class_names=class_names(metadata.get("names")),
        )  # traced YOLOv8 takes any batch size: shapes are traced, not baked in
        super().__init__(
            info,
            module,
            input_dtype=torch.float16 if half else torch.float32,
            options=options,
        )
