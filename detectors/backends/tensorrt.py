"""Serialized TensorRT engines on ``cuda:N`` (TensorRT 10 and a CUDA build of torch); building
and reading engine files is :mod:`detectors.tensorrt`."""

from __future__ import annotations

from pathlib import Path

from detectors.backends import BackendPlugin
from detectors.base import Backend, BackendOptions

PLUGIN = BackendPlugin(suffixes=(".engine",), extra="tensorrt")


def open_backend(path: Path, options: BackendOptions) -> Backend:
    from detectors.tensorrt.backend import TensorRTBackend

    return TensorRTBackend(path, options)
