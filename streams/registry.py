"""Registries of one module per kind (sinks, outputs, batching policies): a package's modules,
each found by its file name and checked at the first import, so adding a kind is adding a
module and a mistake in one is found at once, not when a config first names it."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from types import ModuleType
from typing import get_args


def kind_modules(
    package: str, path: Iterable[str], *, skip: frozenset[str], field: str, entry: str
) -> dict[str, ModuleType]:
    """Every module of ``package`` (its ``__path__``) but ``skip``, by name; each must define
    ``Options`` whose ``field`` is ``Literal["<module name>"]`` and a callable ``entry``."""
    modules = {}
    for info in pkgutil.iter_modules(path):
        if info.name in skip:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        options = getattr(module, "Options", None)
        names = get_args(options.model_fields[field].annotation) if options else ()
        if names != (info.name,) or not callable(getattr(module, entry, None)):
            raise TypeError(
                f"{module.__name__} must define Options ({field}: Literal[{info.name!r}]) "
                f"and {entry}(...)"
            )
        modules[info.name] = module
    return modules
