"""Backend selection: a plain map from model-file suffix / backend name to backend class."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from detectors.base import EXTRAS, Backend, BackendOptions, BackendUnavailable
from detectors.catalog import fetch_hint

# name -> ("module:Class", extra that provides its libraries); imported lazily so heavy
# libraries load only when used.
BACKENDS: dict[str, tuple[str, str | None]] = {
    "onnxruntime": ("detectors.onnx_backend:OnnxRuntimeBackend", None),
    "torchscript": ("detectors.torch_backend:TorchScriptBackend", "torch"),
    "ultralytics": ("detectors.ultralytics_backend:UltralyticsBackend", "ultralytics"),
    "tensorrt": ("detectors.tensorrt_backend:TensorRTBackend", "tensorrt"),
}
SUFFIXES: dict[str, str] = {
    ".onnx": "onnxruntime",
    ".torchscript": "torchscript",
    ".pt": "ultralytics",
    ".engine": "tensorrt",
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


def backend_class(name: str) -> type[Any]:
    """The class of backend ``name``; BackendUnavailable names the extra when a library is
    missing (the project's own modules are always there, so any missing module is a library)."""
    target, extra = BACKENDS[name]
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra is None or (exc.name or "").split(".")[0] in ("detectors", "pipeline", "streams"):
            raise
        raise BackendUnavailable(
            f"the {name} backend needs {exc.name!r}, which is not installed: {EXTRAS[extra]}"
        ) from exc
    return getattr(module, class_name)


def load_backend(
    path: Path, backend: str = "auto", options: BackendOptions | None = None, **overrides: Any
) -> Backend:
    """Load a model with the backend chosen for it (``overrides`` replace fields of options)."""
    name = backend_name_for(path, backend)
    check_model_file(path, name)
    options = replace(options or BackendOptions(), **overrides)
    return backend_class(name)(path, options)


#: Backends that run rectangular batches (``model.rect``): their input may be any
#: stride-aligned height x width when the model allows it.
RECT_BACKENDS = ("onnxruntime",)
#: Backends whose sessions run side by side on a CPU, each with its own threads (torch's CPU
#: threads are one pool per process, so more torch instances would only contend).
SPLIT_BACKENDS = ("onnxruntime",)


def takes_any_size(path: Path, backend: str = "auto") -> bool:
    """Whether the model takes images of any height and width with this backend, found
    before the model is loaded (the decoders letterbox before the detector is ready)."""
    name = backend_name_for(path, backend)
    if name not in RECT_BACKENDS:
        return False
    check_model_file(path, name)
    from detectors.onnx_backend import onnx_input_size

    return onnx_input_size(path) == (None, None)


# First bytes of the files each backend reads: a torch checkpoint or TorchScript module is a zip
# archive; an ONNX model is a protobuf whose first field is ir_version (tag 0x08).
_MAGIC: dict[str, tuple[bytes, str]] = {
    "onnxruntime": (b"\x08", "an ONNX model (protobuf)"),
    "torchscript": (b"PK", "a TorchScript archive (zip)"),
    "ultralytics": (b"PK", "a PyTorch checkpoint (zip)"),
}


def check_model_file(path: Path, backend: str) -> None:
    """A missing, empty or plainly wrong file as one line, before a library sees it (their
    errors are tracebacks or pages of C++ context)."""
    if not path.is_file():
        hint = fetch_hint(path)
        raise FileNotFoundError(f"{hint} (no {path})" if hint else f"model file not found: {path}")
    with path.open("rb") as file:
        head = file.read(8)
    if not head:
        raise ValueError(f"model file {path} is empty")
    magic, what = _MAGIC.get(backend, (b"", ""))
    if not head.startswith(magic):
        raise ValueError(f"model file {path} is not {what}: its first bytes are {head[:4]!r}")
