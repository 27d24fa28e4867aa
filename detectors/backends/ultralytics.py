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
)


def open_backend(path: Path, options: BackendOptions) -> Backend:
    from detectors.device.checkpoint import UltralyticsBackend

    return UltralyticsBackend(path, options)
