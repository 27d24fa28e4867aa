"""Ultralytics ``.pt`` checkpoints, through the optional ``ultralytics`` extra (AGPL-3.0).

Ultralytics is used only to unpickle the checkpoint into its ``DetectionModel``; the model then
runs on the same device path as TorchScript (:class:`DeviceBackend`), with framebatch's own
pre- and post-processing, so results match the other backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from detectors.base import EXTRAS, BackendOptions, BackendUnavailable, ModelInfo
from detectors.device.backend import DeviceBackend, check_device
from detectors.metadata import class_names


class RawOutput(torch.nn.Module):
    """The decoded ``(N, 4 + classes, anchors)`` output alone (Ultralytics' Detect head returns
    it with its feature maps outside export mode)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        output = self.model(images)
        return output[0] if isinstance(output, list | tuple) else output


def load_checkpoint(path: Path, device: torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The fused, eval-mode ``DetectionModel`` of a checkpoint on ``device``, and its facts."""
    try:
        from ultralytics import YOLO
    except ImportError as exc:
        raise BackendUnavailable(
            f"{path.name}: .pt checkpoints need Ultralytics: {EXTRAS['ultralytics']}; "
            "or export the model once with `framebatch export` on a machine that has it"
        ) from exc
    yolo = YOLO(str(path), task="detect")
    model = yolo.model.to(device).fuse().eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    args = getattr(model, "args", {}) or {}
    facts = {
        "names": yolo.names,
        "stride": int(max(model.stride)),
        "imgsz": args.get("imgsz", 640) if isinstance(args, dict) else 640,
    }
    return model, facts


class UltralyticsBackend(DeviceBackend):
    """A ``.pt`` checkpoint run by torch on ``cpu`` or ``cuda:N`` (FP16 on CUDA if asked)."""

    name = "ultralytics"

    def __init__(self, path: Path, options: BackendOptions | None = None):
        options = options or BackendOptions()
        device = check_device(options)
        model, facts = load_checkpoint(path, device)
        half = options.half and device.type == "cuda"
        if half:
            model.half()
        info = ModelInfo(
            path=str(path),
            backend=self.name,
            input_width=options.imgsz,  # a .pt takes any multiple of its stride
            input_height=options.imgsz,
            class_names=class_names(facts["names"], 80),  # COCO when it says nothing
            any_size=True,
        )
        # no CUDA graphs: the Detect head rebuilds its anchor tensors whenever the input shape
        # changes, so a graph would replay the freed anchors of another batch size
        super().__init__(
            info,
            RawOutput(model),
            input_dtype=torch.float16 if half else torch.float32,
            options=options,
            graphs_allowed=False,
        )
