"""TensorRT engine files: Ultralytics' JSON metadata header, plain engines, sidecar metadata.

Ultralytics' exporter writes ``<int32 little-endian length><UTF-8 JSON metadata><serialized
engine>``; its loader reads the same layout and falls back to a plain engine when there is none.
framebatch writes that exact layout, so its engines load in ``YOLO("x.engine")`` and Ultralytics'
engines load here. Engines built elsewhere (``trtexec``) have no header; their model facts can
sit in a sidecar JSON next to them (``x.engine.json``, else ``x.json``), in the same keys.

Our own facts (batch range, precision) sit under a ``framebatch`` key so they can never clash
with a key Ultralytics reads. Pure Python: nothing here needs TensorRT.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detectors.metadata import class_names as read_class_names
from detectors.metadata import imgsz as read_imgsz
from detectors.metadata import literal

LENGTH_BYTES = 4  # int32, little-endian, signed: as Ultralytics writes it
OUR_KEY = "framebatch"


class EngineFileError(ValueError):
    """An engine file (or its sidecar) is unreadable; the message names the file."""


@dataclass(frozen=True)
class EngineFile:
    """What an engine file says about its model, and where the serialized engine starts.

    Typed fields are ``None`` where neither the header nor a sidecar says; the engine itself
    (input shape, optimisation profile) is the authority on those, see ``TensorRTEngine``.
    """

    path: Path
    metadata: dict[str, Any]  # header JSON, updated by the sidecar's keys when there is one
    engine_offset: int  # bytes before the serialized engine (0: no header)
    engine_size: int
    has_header: bool
    sidecar: Path | None
    class_names: tuple[str, ...]
    imgsz: tuple[int, int] | None  # (height, width)
    min_batch: int | None
    opt_batch: int | None
    max_batch: int | None
    half: bool | None
    int8: bool | None
    # its profile spans heights and widths up to imgsz: rectangular batches (model.rect)
    any_size: bool = False

    def read_engine(self) -> bytes:
        """The serialized engine without the header: what ``deserialize_cuda_engine`` takes."""
        with self.path.open("rb") as handle:
            handle.seek(self.engine_offset)
            data = handle.read()
        if len(data) != self.engine_size:
            raise EngineFileError(f"{self.path}: the file changed while it was being read")
        return data


def sidecar_candidates(engine_path: Path) -> tuple[Path, Path]:
    """Where a sidecar may sit: ``yolov8n.engine.json``, then ``yolov8n.json``."""
    return engine_path.with_name(engine_path.name + ".json"), engine_path.with_suffix(".json")


def encode_header(metadata: Mapping[str, Any]) -> bytes:
    """The header bytes exactly as Ultralytics writes them (``json.dumps`` defaults, ASCII)."""
    text = json.dumps(dict(metadata)).encode("utf-8")
    return len(text).to_bytes(LENGTH_BYTES, "little", signed=True) + text


def write_engine_file(
    path: Path, engine: bytes | bytearray | memoryview, metadata: Mapping[str, Any] | None
) -> EngineFile:
    """Write ``[header] + engine`` atomically (a crashed build never leaves a half engine).

    ``metadata=None`` writes a plain engine, as ``trtexec`` would.
    """
    path = Path(path)
    if len(memoryview(engine)) == 0:
        raise EngineFileError(f"{path}: refusing to write an empty engine")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("wb") as handle:
            if metadata is not None:
                handle.write(encode_header(metadata))
            handle.write(engine)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return read_engine_file(path)


def read_engine_file(path: Path) -> EngineFile:
    """Read an engine file's metadata (header and/or sidecar) without reading the engine."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"engine file not found: {path}")
    size = path.stat().st_size
    with path.open("rb") as handle:
        header, offset = _read_header(path, handle, size)
    sidecar = next((p for p in sidecar_candidates(path) if p.is_file()), None)
    metadata = dict(header or {})
    if sidecar is not None:
        metadata.update(_read_sidecar(sidecar))
    try:
        return _typed(path, metadata, offset, size, header is not None, sidecar)
    except (TypeError, ValueError, SyntaxError) as exc:
        source = sidecar if sidecar is not None else path
        raise EngineFileError(f"{source}: malformed model metadata: {exc}") from None


def _read_header(path: Path, handle: Any, size: int) -> tuple[dict[str, Any] | None, int]:
    prefix = handle.read(LENGTH_BYTES + 1)
    if len(prefix) <= LENGTH_BYTES:
        raise EngineFileError(f"{path}: {size} bytes is too small to be a TensorRT engine")
    # Ultralytics' JSON always starts with "{"; a serialized engine starts with its own magic
    # tag, so a "{" after the length field is what tells a header from a plain engine.
    if prefix[LENGTH_BYTES:] != b"{":
        return None, 0
    length = int.from_bytes(prefix[:LENGTH_BYTES], "little", signed=True)
    available = size - LENGTH_BYTES
    if not 0 < length <= available:
        raise EngineFileError(
            f"{path}: corrupt metadata header: it claims {length} bytes of JSON but "
            f"{available} bytes follow the length field (truncated or damaged engine file)"
        )
    raw = b"{" + handle.read(length - 1)
    try:
        metadata = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineFileError(f"{path}: corrupt metadata header (not valid JSON: {exc})") from None
    if not isinstance(metadata, dict):
        raise EngineFileError(f"{path}: corrupt metadata header (a JSON object was expected)")
    if length == available:
        raise EngineFileError(f"{path}: metadata header but no engine after it (truncated file)")
    return metadata, LENGTH_BYTES + length


def _read_sidecar(sidecar: Path) -> dict[str, Any]:
    try:
        metadata = json.loads(sidecar.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineFileError(f"{sidecar}: not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise EngineFileError(f"{sidecar}: a JSON object of model facts was expected")
    return metadata


def _typed(
    path: Path,
    metadata: dict[str, Any],
    offset: int,
    size: int,
    has_header: bool,
    sidecar: Path | None,
) -> EngineFile:
    ours = _mapping(metadata.get(OUR_KEY), OUR_KEY)
    args = _mapping(metadata.get("args"), "args")
    batches = _batch_range(metadata, ours, args)

    def first(key: str) -> Any:  # ours, then top level (hand-written sidecars)
        return ours.get(key, metadata.get(key))

    return EngineFile(
        path=path,
        metadata=metadata,
        engine_offset=offset,
        engine_size=size - offset,
        has_header=has_header,
        sidecar=sidecar,
        class_names=read_class_names(metadata.get("names")),
        imgsz=read_imgsz(metadata.get("imgsz")),
        min_batch=batches[0],
        opt_batch=batches[1],
        max_batch=batches[2],
        half=_flag(first("half"), args.get("half"), args.get("quantize"), 16),
        int8=_flag(first("int8"), args.get("int8"), args.get("quantize"), 8),
        # ours says so; Ultralytics' dynamic=True engines span 32x32 to 2x imgsz in H and W
        any_size=bool(ours["rect"] if "rect" in ours else not ours and args.get("dynamic")),
    )


def _mapping(value: Any, key: str) -> dict[str, Any]:
    value = literal(value) if value is not None else {}
    if not isinstance(value, dict):
        raise ValueError(f"{key!r} must be an object, got {type(value).__name__}")
    return value


def _optional_int(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{key!r} must be an integer, got {value!r}")
    return int(value)


def _batch_range(
    metadata: dict[str, Any], ours: dict[str, Any], args: dict[str, Any]
) -> tuple[int | None, int | None, int | None]:
    keys = ("min_batch", "opt_batch", "max_batch")
    source = ours if any(k in ours for k in keys) else metadata
    explicit = tuple(_optional_int(source.get(k), k) for k in keys)
    if any(v is not None for v in explicit):
        return explicit  # type: ignore[return-value]
    batch = _optional_int(metadata.get("batch"), "batch")
    if batch is None:
        return None, None, None
    if literal(args.get("dynamic")):
        # Ultralytics' dynamic export: profile 1..batch; its opt changed across versions.
        return 1, None, batch
    return batch, batch, batch


def _flag(ours: Any, legacy: Any, quantize: Any, bits: int) -> bool | None:
    """Ours, else Ultralytics' ``args.half``/``args.int8``, else its newer ``args.quantize``."""
    for value in (ours, legacy):
        if value is not None:
            return bool(literal(value))
    if quantize is not None:
        return str(quantize).lower().removeprefix("fp").removeprefix("int") == str(bits)
    return None
