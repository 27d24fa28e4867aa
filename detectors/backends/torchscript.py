"""TorchScript files on ``cpu`` or ``cuda:N`` (the ``torch`` extra), through the device path."""

from __future__ import annotations

from pathlib import Path

from detectors.backends import BackendPlugin
from detectors.base import Backend, BackendOptions

PLUGIN = BackendPlugin(
    suffixes=(".torchscript",),
    extra="torch",
    magic=b"PK",
    file_kind="a TorchScript archive (zip)",
)


def open_backend(path: Path, options: BackendOptions) -> Backend:
    from detectors.device.torchscript import TorchScriptBackend

    return TorchScriptBackend(path, options)
