"""Config errors that read like directions: ``dotted.path: message`` lines, close-match hints.

No message echoes a string the user wrote (it could hold a password); numbers and type names only.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from pipeline.errors import BadInput

MAX_LINE = 400  # an error line never echoes more than this (a value may be megabytes)
MAX_VALUE = 80  # characters of a user's value quoted in a message

Problem = tuple[tuple[str | int, ...], str, Any]  # (loc below the model, message, input)


class ConfigError(BadInput):
    """An invalid config: ``errors`` holds one ``dotted.path: message`` line per problem."""

    def __init__(self, errors: Sequence[str], source: str = "<config>") -> None:
        self.errors = [clip(line, MAX_LINE) for line in errors]
        self.source = clip(source, MAX_LINE)
        super().__init__(self.errors, source)  # args that rebuild it, so it pickles

    def __str__(self) -> str:
        count = f"{len(self.errors)} error" + ("s" if len(self.errors) != 1 else "")
        return "\n".join(
            [f"invalid config {self.source} ({count}):"] + [f"  - {e}" for e in self.errors]
        )


def clip(text: str, limit: int = MAX_VALUE) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def fail(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (no "Value error, " prefix)."""
    return PydanticCustomError("config", "{message}", {"message": message})


def fail_at(title: str, problems: Sequence[Problem]) -> ValidationError:
    """Errors at sub-locations of the model being validated (pydantic keeps their ``loc``)."""
    details = [InitErrorDetails(type=fail(m), loc=loc, input=v) for loc, m, v in problems]
    return ValidationError.from_exception_data(title, details)


_MESSAGES = {
    "missing": "required",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "literal_error": "must be {expected}",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "too_long": "at most {max_length} items",
    "path_type": "must be a file path",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "finite_number": "must be a finite number",
}
_NUMERIC = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of"}
_NUMERIC |= {"int_from_float", "finite_number"}  # errors whose input is a number, safe to echo
_YAML_TYPES = {type(None): "null", dict: "mapping", str: "string", list: "list"}


def _dotted(loc: Sequence[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def line_at(loc: Sequence[str | int], message: str) -> str:
    return f"{_dotted(loc)}: {message}" if loc else message


def _members(annotation: Any) -> list[Any]:
    """The annotation itself, or the members of a union (``X | None``)."""
    if get_origin(annotation) is Annotated:
        return _members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]


def _kinds(annotation: Any) -> dict[str, type[BaseModel]]:
    """The members of a union tagged by ``kind`` (the sinks), by tag."""
    tagged = {}
    for model in _models(annotation):
        field = model.model_fields.get("kind")
        for tag in get_args(field.annotation) if field else ():
            tagged[tag] = model
    return tagged


def _walk(root: Any, loc: Sequence[str | int]) -> tuple[list[str | int], Any]:
    """``loc`` without the tags pydantic puts in it for a tagged union, and the annotation
    found by walking it through fields, list items, Optionals and tagged unions."""
    annotation: Any = root
    shown: list[str | int] = []
    for part in loc:
        if isinstance(part, int):
            lists = [m for m in _members(annotation) if get_origin(m) is list]
            annotation = get_args(lists[0])[0] if lists else None
        elif len(_models(annotation)) > 1 and part in _kinds(annotation):
            annotation = _kinds(annotation)[part]  # sinks[0].jsonl.path: the tag goes
            continue
        else:
            models = _models(annotation) if annotation is not None else []
            field = models[0].model_fields.get(part) if models else None
            annotation = field.annotation if field else None
        shown.append(part)
    return shown, annotation


def _model_at(root: Any, loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class found by walking ``loc`` through fields, list items and Optionals."""
    models = _models(_walk(root, loc)[1])
    return models[0] if models else None


def _union_tag(kind: str, ctx: dict[str, Any], annotation: Any) -> tuple[str, str]:
    """A tagged union's missing or unknown tag: the field it is in, and the message."""
    known = ", ".join(_kinds(annotation))
    if kind == "union_tag_not_found":
        return str(ctx.get("discriminator", "kind")).strip("'"), f"required (one of: {known})"
    tag = clip(str(ctx.get("tag", "")))
    return str(ctx.get("discriminator", "kind")).strip("'"), f"unknown {tag!r} (one of: {known})"


def _unknown_key(root: type[BaseModel], loc: Sequence[str | int]) -> str:
    *parent, key = loc
    model = _model_at(root, parent)
    names = list(model.model_fields) if model else []
    where = "unknown key" if parent else "unknown top-level key"
    close = difflib.get_close_matches(str(key)[:MAX_VALUE], names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (expected one of: {', '.join(names)})"
    return line_at(_walk(root, parent)[0], f"{where} {clip(str(key))!r}{hint}")


def format_validation_errors(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """One ``dotted.path: message`` line per error of ``exc`` raised while validating ``model``."""
    lines = []
    for error in exc.errors(include_url=False, include_input=True):
        loc, kind, ctx = error["loc"], error["type"], error.get("ctx") or {}
        if kind == "extra_forbidden":
            lines.append(_unknown_key(model, loc))
            continue
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            shown, annotation = _walk(model, loc)
            field, message = _union_tag(kind, ctx, annotation)
            lines.append(line_at([*shown, field], message))
            continue
        loc = _walk(model, loc)[0]
        if kind == "too_short":
            message = "must not be empty" if ctx.get("min_length") == 1 else "too few items"
        elif kind in _MESSAGES:
            message = _MESSAGES[kind].format(**ctx)
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
        value = error.get("input")
        if kind in _NUMERIC and isinstance(value, int | float) and not isinstance(value, bool):
            message += f" (got {value})"
        elif kind.endswith("_type") or kind.endswith("_parsing"):
            message += f" (got {_YAML_TYPES.get(type(value), type(value).__name__)})"
        lines.append(line_at(loc, message))
    return lines
