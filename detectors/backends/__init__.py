"""Detector backends as plug-ins: one module per backend in this package, named as the backend.

A backend module defines

* ``PLUGIN``: a :class:`BackendPlugin` — the model-file suffixes it reads, the optional extra
  that installs its libraries, the first bytes of its files, and whether it runs rectangular
  batches or side-by-side instances on a CPU;
* ``open_backend(path, options) -> Backend``, which imports the backend's libraries (torch,
  TensorRT, ONNX Runtime) only when called, so listing the backends loads none of them;
* ``input_size(path) -> (height | None, width | None)`` where ``PLUGIN.rect`` is set: the
  model's input size read without loading it (None: that axis takes any size).

Everything else is derived from those modules: the backend names the config accepts, the
suffixes ``auto`` picks by, the file checks, the extra named when a library is missing.
Adding a backend is one new module here.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from detectors.base import EXTRAS, Backend, BackendOptions, BackendUnavailable
from detectors.catalog import fetch_hint


@dataclass(frozen=True)
class BackendPlugin:
    """What a backend module declares about itself."""

    suffixes: tuple[str, ...]  # model files it reads, lower case, with the dot
    extra: str | None = None  # key of detectors.base.EXTRAS: what installs its libraries
    magic: bytes = b""  # the first bytes of its model files ("" = not checked)
    file_kind: str = ""  # what such a file is, for the error when the magic is wrong
    rect: bool = False  # runs rectangular batches where the model takes any size
    # runs several sessions side by side on a CPU, each with its own threads (model.instances)
    cpu_instances: bool = False


_PROJECT_PACKAGES = ("detectors", "pipeline", "streams")


@functools.cache
def backend_modules() -> dict[str, ModuleType]:
    """Every backend module of this package, by name."""
    modules = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        plugin = getattr(module, "PLUGIN", None)
        if not isinstance(plugin, BackendPlugin) or not callable(
            getattr(module, "open_backend", None)
        ):  # a mistake in a new backend, found by the first import
            raise TypeError(f"{module.__name__} must define PLUGIN and open_backend")
        if plugin.extra is not None and plugin.extra not in EXTRAS:
            raise TypeError(f"{module.__name__}: unknown extra {plugin.extra!r}")
        modules[info.name] = module
    return modules


def plugin(name: str) -> BackendPlugin:
    return backend_modules()[name].PLUGIN


def backend_names() -> tuple[str, ...]:
    return tuple(sorted(backend_modules()))


def suffixes() -> dict[str, str]:
    """Model-file suffix -> the backend ``auto`` picks for it."""
    return {suffix: name for name in backend_names() for suffix in plugin(name).suffixes}


def backend_name_for(path: Path, backend: str = "auto") -> str:
    """The backend to use for a model file; ``auto`` picks it by suffix."""
    if backend != "auto":
        if backend not in backend_modules():
            known = ", ".join(backend_names())
            raise ValueError(f"unknown backend {backend!r} (known: {known})")
        return backend
    try:
        return suffixes()[path.suffix.lower()]
    except KeyError:
        known = ", ".join(suffixes())
        raise ValueError(
            f"unsupported model file {path.name!r} (supported suffixes: {known})"
        ) from None


def load_backend(
    path: Path, backend: str = "auto", options: BackendOptions | None = None, **overrides: Any
) -> Backend:
    """Load a model with the backend chosen for it (``overrides`` replace fields of options).
    A missing library is ``BackendUnavailable`` naming the extra that installs it."""
    name = backend_name_for(path, backend)
    check_model_file(path, name)
    options = replace(options or BackendOptions(), **overrides)
    try:
        return backend_modules()[name].open_backend(path, options)
    except ModuleNotFoundError as exc:
        extra = plugin(name).extra
        if extra is None or (exc.name or "").split(".")[0] in _PROJECT_PACKAGES:
            raise  # the project's own modules are always there: a bug, not an extra
        raise BackendUnavailable(
            f"the {name} backend needs {exc.name!r}, which is not installed: {EXTRAS[extra]}"
        ) from exc


def takes_any_size(path: Path, backend: str = "auto") -> bool:
    """Whether the model takes images of any height and width with this backend, found
    before the model is loaded (the decoders letterbox before the detector is ready)."""
    name = backend_name_for(path, backend)
    if not plugin(name).rect:
        return False
    check_model_file(path, name)
    return backend_modules()[name].input_size(path) == (None, None)


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
    declared = plugin(backend)
    if not head.startswith(declared.magic):
        raise ValueError(
            f"model file {path} is not {declared.file_kind}: its first bytes are {head[:4]!r}"
        )
