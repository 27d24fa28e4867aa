"""The one reader of model metadata: every format framebatch runs stores its facts in
Ultralytics' layout (ONNX ``metadata_props``, TorchScript ``config.txt``, an engine's JSON header
or sidecar, a checkpoint's attributes), as Python or JSON values or as their literals in
strings.  Each backend hands its raw values here and gets the same typed facts back."""

from __future__ import annotations

import ast
from typing import Any


def literal(value: Any) -> Any:
    """A value as stored: Ultralytics' ONNX/YAML metadata keeps dicts and lists as Python
    literals in strings (JSON objects are valid literals too); anything else as it is."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def class_names(value: Any, class_count: int = 0) -> tuple[str, ...]:
    """``{"0": "person", ...}`` (JSON), ``{0: "person"}``, ``["person", ...]`` or their literal
    as a tuple by class id; absent: the numbers ``0..class_count-1``.  A value that is neither,
    or ids that do not number the classes 0..n-1, is a ``ValueError``."""
    try:
        value = literal(value)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"'names' is not a readable literal: {exc}") from None
    if value is None or (isinstance(value, dict | list | tuple) and not value):
        return tuple(str(i) for i in range(class_count))
    if isinstance(value, dict):
        indexed = {int(key): str(name) for key, name in value.items()}
        if sorted(indexed) != list(range(len(indexed))):
            raise ValueError(f"'names' must number the classes 0..{len(indexed) - 1}")
        return tuple(indexed[i] for i in range(len(indexed)))
    if isinstance(value, list | tuple):
        return tuple(str(name) for name in value)
    raise ValueError(f"'names' must be a list or an object, got {type(value).__name__}")


def imgsz(value: Any) -> tuple[int, int] | None:
    """``640`` or ``[height, width]`` (Ultralytics' order) as ``(height, width)``."""
    value = literal(value)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, list | tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    raise ValueError(f"'imgsz' must be an int or [height, width], got {value!r}")
