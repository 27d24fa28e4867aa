"""The framebatch config: pydantic models, YAML loading, ``${VAR}`` interpolation, readable errors.

Declared once, validated once. Every error is a line ``dotted.path: message`` and no message
ever shows a password from a URL. Validators do no I/O: relative paths are joined to the
config file's folder (passed as validation context ``base_dir``) but never checked on disk.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import unquote

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from streams.urls import is_live_url, redact_url, url_scheme

#: Model file suffix -> backend name used by ``backend: auto``.
MODEL_SUFFIXES: dict[str, str] = {".onnx": "onnxruntime"}
#: URL schemes a camera may use; anything without ``scheme://`` is a file path.
CAMERA_SCHEMES = ("rtsp", "rtsps")
#: Schemes of live (real-time, not seekable) sources.

_KEY_PART = re.compile(r"[A-Za-z0-9_.-]+")
_ENV_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

Finite = Annotated[float, Field(allow_inf_nan=False)]
ClassIds = Annotated[list[Annotated[int, Field(ge=0, le=999)]], Field(min_length=1)]
Problem = tuple[tuple[str | int, ...], str, Any]  # (loc below the model, message, input)


class ConfigError(Exception):
    """An invalid config: ``errors`` holds one ``dotted.path: message`` line per problem."""

    def __init__(self, errors: Sequence[str], source: str = "<config>") -> None:
        self.errors = list(errors)
        self.source = source
        super().__init__(self.errors, source)  # args that rebuild it, so it pickles

    def __str__(self) -> str:
        count = f"{len(self.errors)} error" + ("s" if len(self.errors) != 1 else "")
        return "\n".join(
            [f"invalid config {self.source} ({count}):"] + [f"  - {e}" for e in self.errors]
        )


def _fail(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (no "Value error, " prefix)."""
    return PydanticCustomError("config", "{message}", {"message": message})


def _fail_at(title: str, problems: Sequence[Problem]) -> ValidationError:
    """Errors at sub-locations of the model being validated (pydantic keeps their ``loc``)."""
    details = [InitErrorDetails(type=_fail(m), loc=loc, input=v) for loc, m, v in problems]
    return ValidationError.from_exception_data(title, details)


def _resolve(path: Path, info: ValidationInfo) -> Path:
    """Join a relative path to the ``base_dir`` validation context, if any (no disk access)."""
    base_dir = (info.context or {}).get("base_dir")
    return Path(base_dir) / path if base_dir is not None and not path.is_absolute() else path


def _key_part(value: str, what: str, max_len: int) -> str:
    if len(value) > max_len or not _KEY_PART.fullmatch(value):
        raise _fail(
            f"invalid {what} {value!r}: use 1-{max_len} letters, digits, '_', '.' or '-' "
            "(it becomes part of Redis keys)"
        )
    return value


class RedisConfig(BaseModel):
    """Where frames and detections live."""

    model_config = _MODEL_CONFIG
    url: str | None = Field(None, description="redis:// URL; unset: start a private redis-server")
    prefix: str = Field("fb", description="Key prefix: <prefix>:frames:<camera>, ...")
    frames_maxlen: int = Field(64, ge=2, description="MAXLEN ~ of each frames stream")
    detections_maxlen: int = Field(100_000, ge=1, description="MAXLEN ~ of each detections stream")

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, prefix: str) -> str:
        return _key_part(prefix, "key prefix", 64)


class ModelConfig(BaseModel):
    """The detector model and its post-processing."""

    model_config = _MODEL_CONFIG
    path: Path = Field(description="Model file; relative paths are relative to the config file")
    backend: Literal["auto", "onnxruntime"] = Field("auto", description="auto: by file suffix")
    imgsz: int = Field(640, ge=32, le=4096, multiple_of=32, description="Input size in pixels")
    conf: Finite = Field(0.25, ge=0, le=1, description="Minimum detection confidence")
    iou: Finite = Field(0.45, gt=0, le=1, description="IoU threshold of non-maximum suppression")
    max_det: int = Field(300, ge=1, description="Most detections kept per frame")
    classes: ClassIds | None = Field(None, description="Class ids to keep; unset keeps all")
    threads: int | None = Field(None, ge=1, description="ONNX Runtime intra-op threads")

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: Path, info: ValidationInfo) -> Path:
        if path.suffix.lower() not in MODEL_SUFFIXES:
            supported = ", ".join(MODEL_SUFFIXES)
            raise _fail(f"unsupported model file {path.name!r} (supported suffixes: {supported})")
        return _resolve(path, info)


class BatchingConfig(BaseModel):
    """How frames of all cameras are grouped into one inference batch."""

    model_config = _MODEL_CONFIG
    max_batch_size: int = Field(8, ge=1, le=256, description="Most frames per inference batch")
    max_wait_ms: Finite = Field(50.0, ge=0, description="Longest wait for a batch to fill, in ms")


class CameraConfig(BaseModel):
    """One video source: an RTSP stream or a video file."""

    model_config = _MODEL_CONFIG
    id: str = Field(description="Camera id, 1-64 of [A-Za-z0-9_.-]; part of Redis keys")
    url: str = Field(description="rtsp:// or rtsps:// URL, or a file path (file:// allowed)")
    realtime: bool | None = Field(None, description="Pace file playback at the clip's frame rate")
    loop: bool = Field(False, description="Restart a file at its end (files only)")
    fps: Finite | None = Field(None, gt=0, description="Override of the pacing / frame rate")
    max_backlog: int | None = Field(None, ge=1, description="Frames queued before drop or block")

    @field_validator("id")
    @classmethod
    def _check_id(cls, camera_id: str) -> str:
        return _key_part(camera_id, "camera id", 64)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str, info: ValidationInfo) -> str:
        scheme = url_scheme(url) or None
        if scheme in CAMERA_SCHEMES:
            return url
        if scheme == "file":
            rest = url[len("file://") :]
            url = unquote(rest[len("localhost") :] if rest.startswith("localhost/") else rest)
        elif scheme is not None:
            raise _fail(
                f"unsupported URL scheme {scheme!r} in {redact_url(url)!r} "
                "(expected rtsp://, rtsps:// or a file path)"
            )
        if not url.strip():
            raise _fail("must not be empty")
        return str(_resolve(Path(url), info))

    @model_validator(mode="after")
    def _check_loop(self) -> CameraConfig:
        if self.loop and self.is_live:
            message = f"loop is only for files; {redact_url(self.url)!r} is a live source"
            raise _fail_at(type(self).__name__, [(("loop",), message, True)])
        return self

    @property
    def is_live(self) -> bool:
        """True for network streams (rtsp, rtsps, rtmp, http(s), udp), False for files."""
        return is_live_url(self.url)


class Config(BaseModel):
    """The whole framebatch config file."""

    model_config = _MODEL_CONFIG
    redis: RedisConfig = Field(default_factory=RedisConfig, description="Redis and its bounds")
    model: ModelConfig = Field(description="Detector model")
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="Batching policy")
    cameras: list[CameraConfig] = Field(min_length=1, description="Video sources, unique ids")

    @model_validator(mode="after")
    def _check_cameras(self) -> Config:
        problems: list[Problem] = []
        first: dict[str, int] = {}
        for index, camera in enumerate(self.cameras):
            if camera.id in first:
                message = f"duplicate camera id {camera.id!r} (also cameras[{first[camera.id]}])"
                problems.append((("cameras", index, "id"), message, camera.id))
            first.setdefault(camera.id, index)
            if camera.max_backlog is not None and camera.max_backlog > self.redis.frames_maxlen:
                message = f"must be <= redis.frames_maxlen ({self.redis.frames_maxlen})"
                problems.append((("cameras", index, "max_backlog"), message, camera.max_backlog))
        if problems:
            raise _fail_at(type(self).__name__, problems)
        return self

    def camera(self, camera_id: str) -> CameraConfig:
        """The camera with this id; KeyError names the configured ids otherwise."""
        for camera in self.cameras:
            if camera.id == camera_id:
                return camera
        known = ", ".join(c.id for c in self.cameras)
        raise KeyError(f"unknown camera id {camera_id!r} (configured: {known})")


# ---------------------------------------------------------------------------- error formatting

_MESSAGES = {
    "missing": "required",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "literal_error": "must be {expected}",
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
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


def _line(loc: Sequence[str | int], message: str) -> str:
    return f"{_dotted(loc)}: {message}" if loc else message


def _members(annotation: Any) -> list[Any]:
    """The annotation itself, or the members of a union (``X | None``)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _model_at(root: Any, loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class found by walking ``loc`` through fields, list items and Optionals."""
    annotation: Any = root
    for part in loc:
        if isinstance(part, int):
            lists = [m for m in _members(annotation) if get_origin(m) is list]
            annotation = get_args(lists[0])[0] if lists else None
        else:
            model = _model_at(annotation, ()) if annotation is not None else None
            field = model.model_fields.get(part) if model else None
            annotation = field.annotation if field else None
    models = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    return models[0] if models else None


def _unknown_key(root: type[BaseModel], loc: Sequence[str | int]) -> str:
    *parent, key = loc
    model = _model_at(root, parent)
    names = list(model.model_fields) if model else []
    where = "unknown key" if parent else "unknown top-level key"
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (expected one of: {', '.join(names)})"
    return _line(parent, f"{where} {key!r}{hint}")


def format_validation_errors(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """One ``dotted.path: message`` line per error of ``exc`` raised while validating ``model``."""
    lines = []
    for error in exc.errors(include_url=False, include_input=True):
        loc, kind, ctx = error["loc"], error["type"], error.get("ctx") or {}
        if kind == "extra_forbidden":
            lines.append(_unknown_key(model, loc))
            continue
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
        lines.append(_line(loc, message))
    return lines


# ---------------------------------------------------------------------------- loading


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (YAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and not key_node.tag.endswith(":merge"):
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _substitute(text: str, environ: Mapping[str, str]) -> str:
    """Expand ``${VAR}``, ``${VAR:-default}`` (default if unset or empty) and ``$${`` -> ``${``."""

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        body = match.group(1)
        ref = _ENV_BODY.fullmatch(body) if body is not None else None
        if ref is None:
            raise ValueError(
                "malformed '${...}': use ${VAR} or ${VAR:-default} ('$${' for a literal '${')"
            )
        name, default = ref.groups()
        value = environ.get(name)
        if default is not None and not value:
            return default
        if value is None:
            raise ValueError(
                f"environment variable {name!r} is not set (set it or write ${{{name}:-default}})"
            )
        return value

    return _ENV_REF.sub(expand, text)


def _interpolate(
    node: Any, environ: Mapping[str, str], loc: tuple[str | int, ...], errors: list[str]
) -> Any:
    """A copy of the parsed YAML ``node`` with variables expanded in every string value."""
    if isinstance(node, str):
        try:
            return _substitute(node, environ)
        except ValueError as exc:
            errors.append(_line(loc, str(exc)))
            return node
    if isinstance(node, Mapping):
        return {k: _interpolate(v, environ, (*loc, str(k)), errors) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, environ, (*loc, i), errors) for i, v in enumerate(node)]
    return node


def parse_config(
    data: Any,
    *,
    base_dir: str | Path,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Interpolate and validate parsed YAML ``data``; relative paths are joined to ``base_dir``."""
    if not isinstance(data, Mapping):
        got = "nothing (empty file)" if data is None else type(data).__name__
        raise ConfigError([f"the config must be a mapping of settings, got {got}"], source)
    errors: list[str] = []
    data = _interpolate(data, os.environ if environ is None else environ, (), errors)
    if errors:
        raise ConfigError(errors, source)
    try:
        return Config.model_validate(data, context={"base_dir": Path(base_dir)})
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, Config), source) from None


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate, resolve and validate a YAML config file; raises :class:`ConfigError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"file not found: {path}"], str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read file: {exc}"], str(path)) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f" ({exc.context})" if exc.context else ""
        raise ConfigError([f"invalid YAML{where}: {exc.problem}{context}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"invalid YAML: {exc}"], str(path)) from None
    return parse_config(data, base_dir=path.absolute().parent, source=str(path), environ=environ)
