"""Backend selection: a plain map from model-file suffix / backend name to backend class."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from detectors.base import Backend

# name -> "module:Class"; imported lazily so heavy libraries load only when used.
BACKENDS: dict[str, str] = {
    "onnxruntime": "detectors.onnx_backend:OnnxRuntimeBackend",
}
SUFFIXES: dict[str, str] = {
    ".onnx": "onnxruntime",
}


def backend_name_for(path: Path, backend: str = "auto") -> str:
    """The backend to use for a model file; ``auto`` picks it by suffix."""
    if backend != "auto":
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(sorted(BACKENDS))})")
        return backend
    try:
        return SUFFIXES[path.suffix.lower()]
    except KeyError:
        known = ", ".join(sorted(SUFFIXES))
        raise ValueError(
            f"unsupported model file {path.name!r} (supported suffixes: {known})"
        ) from None


def load_backend(path: Path, backend: str = "auto", **options: Any) -> Backend:
    """Load a model with the backend chosen for it."""
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    module_name, class_name = BACKENDS[backend_name_for(path, backend)].split(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class(path, **options)
