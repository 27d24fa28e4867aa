"""Ultralytics ``.pt`` checkpoints on ``cpu`` or ``cuda:N`` (the ``ultralytics`` extra, AGPL-3.0):
Ultralytics only unpickles the model; framebatch's device path runs it."""

from __future__ import annotations

from pathlib import Path

from detectors.backends import BackendPlugin
from detectors.base import Backend, BackendOptions

PLUGIN = BackendPlugin(
    suffixes=(".pt",),
    extra="ultralytics",
    magic=b"PK",
    file_kind="a PyTorch checkpoint (zip)",
    rect=True,
)


def open_backend(path: Path, options: BackendOptions) -> Backend:
    from detectors.device.checkpoint import UltralyticsBackend

    return UltralyticsBackend(path, options)


def input_size(path: Path) -> tuple[int | None, int | None]:
    """A YOLOv8 checkpoint takes any multiple of its stride: its head makes its anchors from
    each input's own shape."""
    return None, None
