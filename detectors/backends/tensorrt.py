"""Serialized TensorRT engines on ``cuda:N`` (TensorRT 10 and a CUDA build of torch); building
and reading engine files is :mod:`detectors.tensorrt`."""

from __future__ import annotations

from pathlib import Path

from detectors.backends import BackendPlugin
from detectors.base import Backend, BackendOptions

PLUGIN = BackendPlugin(suffixes=(".engine",), extra="tensorrt", rect=True)


def input_size(path: Path) -> tuple[int | None, int | None]:
    """(height, width) from the engine file's header: None, None for an engine whose profile
    spans heights and widths (built with ``rect``); read without TensorRT."""
    from detectors.tensorrt.engine_file import read_engine_file

    engine = read_engine_file(path)
    if engine.any_size:
        return None, None
    # no metadata: a plain engine's size is fixed in it, known only once TensorRT loads it
    return engine.imgsz or (0, 0)


def open_backend(path: Path, options: BackendOptions) -> Backend:
    from detectors.tensorrt.backend import TensorRTBackend

    return TensorRTBackend(path, options)
