"""What the config's models share: the model settings every section uses, a finite float,
relative paths joined to the config's folder, names that become part of Redis keys."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field, ValidationInfo

from pipeline.config.errors import clip, fail

MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
Finite = Annotated[float, Field(allow_inf_nan=False)]
_KEY_PART = re.compile(r"[A-Za-z0-9_.-]+")


def resolve_path(path: Path, info: ValidationInfo) -> Path:
    """Join a relative path to the ``base_dir`` validation context, if any (no disk access)."""
    base_dir = (info.context or {}).get("base_dir")
    return Path(base_dir) / path if base_dir is not None and not path.is_absolute() else path


def key_part(value: str, what: str, max_len: int) -> str:
    if len(value) > max_len or not _KEY_PART.fullmatch(value):
        raise fail(
            f"invalid {what} {clip(value)!r}: use 1-{max_len} letters, digits, '_', '.' or '-' "
            "(it becomes part of Redis keys)"
        )
    if not value.strip("."):  # '.' and '..' name folders of their own (snapshots)
        raise fail(f"invalid {what} {value!r}: not dots only")
    return value
