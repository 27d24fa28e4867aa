"""TorchScript files (``framebatch export --format torchscript`` or Ultralytics' own): torch
only, on ``cpu`` or ``cuda:N``, through the shared device path."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from detectors.base import BackendOptions, ModelInfo
from detectors.device.backend import DeviceBackend, check_device
from detectors.metadata import class_names

COCO_CLASSES = 80


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
            class_names=class_names(metadata.get("names"), COCO_CLASSES),
        )  # traced YOLOv8 takes any batch size: shapes are traced, not baked in
        super().__init__(
            info,
            module,
            input_dtype=torch.float16 if half else torch.float32,
            options=options,
        )
