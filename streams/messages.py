"""Wire messages: frozen dataclasses with a schema version and explicit Redis field mapping.

Every frame belongs to a decoder *session* (one start of a camera's decoder, a random id) and has a
``frame_id`` ``<session>:<seq>`` that is unique across decoder and daemon restarts, so consumers
of at-least-once delivery can de-duplicate.  ``session`` and ``frame_id`` were added to schema 1
without a version bump: they are additive, readers of either vintage read both.

Frame streams carry two kinds of entries, told apart by the ``kind`` field: ``frame`` (a
letterboxed image with its geometry and timestamps) and ``end`` (the decoder's last word for
one source session: how many frames it decoded and why it stopped).  Detection streams carry
one :class:`DetectionMessage` per decoded frame.

A frame's pixels travel by one of three encodings (the ``encoding`` field; absent means
``raw``, so entries of schema 1 without it still read): ``raw`` pixels inline, ``jpeg`` bytes
inline, or ``shm``: only a :class:`ShmRef` to a same-host shared-memory ring.  Turning pixels
back into an image is ``streams.transport.FrameDecoder``'s job.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SCHEMA_VERSION = 1
ENCODINGS = ("raw", "jpeg", "shm")

Fields = Mapping[bytes, bytes]


def _text(fields: Fields, name: str) -> str:
    return fields[name.encode()].decode()


def _optional_float(fields: Fields, name: str) -> float | None:
    raw = fields.get(name.encode(), b"")
    return float(raw) if raw else None


def _check_version(fields: Fields) -> None:
    version = int(fields.get(b"v", b"0"))
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"unsupported message schema version {version} (expected {SCHEMA_VERSION})"
        )


def _session(fields: Fields) -> str:
    return fields.get(b"session", b"").decode()


def frame_id(session: str, seq: int) -> str:
    """A frame's id: its decoder session and its index in that session."""
    return f"{session}:{seq}"


def new_session_id() -> str:
    """A decoder session's id: random, so ids never repeat across restarts or hosts."""
    return uuid.uuid4().hex[:16]


def message_kind(fields: Fields) -> str:
    """``frame`` or ``end`` for an entry of a frames stream."""
    return fields.get(b"kind", b"frame").decode()


@dataclass(frozen=True)
class ShmRef:
    """Where a frame's pixels wait in a shared-memory ring (the ``shm`` encoding)."""

    segment: str  # file name in /dev/shm, framebatch-<prefix>-<camera>-<pid>
    slot: int
    generation: int  # the slot's generation once the frame was written (seqlock)
    host: str  # writer's hostname and boot id: a reader elsewhere cannot use the reference

    def to_fields(self) -> dict[str, str | int]:
        return {
            "shm_segment": self.segment,
            "shm_slot": self.slot,
            "shm_generation": self.generation,
            "shm_host": self.host,
        }

    @classmethod
    def from_fields(cls, fields: Fields) -> ShmRef:
        return cls(
            segment=_text(fields, "shm_segment"),
            slot=int(fields[b"shm_slot"]),
            generation=int(fields[b"shm_generation"]),
            host=_text(fields, "shm_host"),
        )


@dataclass(frozen=True)
class FrameMessage:
    """One decoded frame, letterboxed to the model input (uint8 BGR, HxWx3)."""

    camera: str
    seq: int  # 0-based decode index since the source was opened; keeps counting across loops
    pts: float | None  # presentation time in seconds, None when the container has none
    width: int  # original frame size
    height: int
    scale: float  # letterbox gain: input pixels per original pixel
    pad_x: int  # letterbox padding on the left / top, in input pixels
    pad_y: int
    captured: float  # epoch seconds when the frame was decoded (or due, when paced)
    enqueued: float  # epoch seconds just before XADD
    pixels: bytes = field(repr=False)  # raw pixels, JPEG bytes, or empty (shm)
    input_width: int = 640
    input_height: int = 640
    encoding: str = "raw"  # one of ENCODINGS
    shm: ShmRef | None = None  # set for the shm encoding only
    session: str = ""  # the decoder session that made it ("" in entries written before sessions)
    redis_down: int = 0  # frames this session shed so far while Redis was unreachable

    @property
    def frame_id(self) -> str:
        """Unique across decoder and daemon restarts: ``<session>:<seq>``."""
        return frame_id(self.session, self.seq)

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown frame encoding {self.encoding!r} (known: {ENCODINGS})")
        if (self.encoding == "shm") != (self.shm is not None):
            raise ValueError("a shm reference goes with the shm encoding, and only with it")

    def image(self) -> np.ndarray:
        """A read-only HxWx3 uint8 view of raw letterboxed pixels (no copy).

        Only for the ``raw`` encoding; ``streams.transport.FrameDecoder`` reads them all."""
        if self.encoding != "raw":
            raise ValueError(f"{self.encoding} frame: read it with streams.transport.FrameDecoder")
        return np.frombuffer(self.pixels, dtype=np.uint8).reshape(
            self.input_height, self.input_width, 3
        )

    def to_fields(self) -> dict[str, bytes | str | int | float]:
        return {
            "v": SCHEMA_VERSION,
            "kind": "frame",
            "encoding": self.encoding,
            **(self.shm.to_fields() if self.shm is not None else {}),
            "camera": self.camera,
            "session": self.session,
            "seq": self.seq,
            "redis_down": self.redis_down,
            "pts": "" if self.pts is None else repr(self.pts),
            "width": self.width,
            "height": self.height,
            "scale": repr(self.scale),
            "pad_x": self.pad_x,
            "pad_y": self.pad_y,
            "captured": repr(self.captured),
            "enqueued": repr(self.enqueued),
            "input_width": self.input_width,
            "input_height": self.input_height,
            "pixels": self.pixels,
        }

    @classmethod
    def from_fields(cls, fields: Fields) -> FrameMessage:
        _check_version(fields)
        encoding = fields.get(b"encoding", b"raw").decode()
        return cls(
            camera=_text(fields, "camera"),
            seq=int(fields[b"seq"]),
            pts=_optional_float(fields, "pts"),
            width=int(fields[b"width"]),
            height=int(fields[b"height"]),
            scale=float(fields[b"scale"]),
            pad_x=int(fields[b"pad_x"]),
            pad_y=int(fields[b"pad_y"]),
            captured=float(fields[b"captured"]),
            enqueued=float(fields[b"enqueued"]),
            input_width=int(fields[b"input_width"]),
            input_height=int(fields[b"input_height"]),
            pixels=fields.get(b"pixels", b""),
            encoding=encoding,
            shm=ShmRef.from_fields(fields) if encoding == "shm" else None,
            session=_session(fields),
            redis_down=int(fields.get(b"redis_down", b"0")),
        )


@dataclass(frozen=True)
class EndOfStream:
    """The decoder's last entry for a source session: nothing of this camera follows it."""

    camera: str
    frames: int  # frames decoded in the session (seq of the last frame + 1)
    reason: str  # "eof", "error", "stopped" or "crashed"
    error: str = ""  # a one-line message naming the camera, passwords redacted
    decode_errors: int = 0  # frames lost in decoding (packets that gave no frame)
    session: str = ""
    redis_down: int = 0  # of ``frames``: shed while Redis was unreachable
    #: frames not taken (vid_stride, max_fps; some never decoded): not in ``frames``
    sampled_out: int = 0

    def to_fields(self) -> dict[str, str | int]:
        return {
            "v": SCHEMA_VERSION,
            "kind": "end",
            "camera": self.camera,
            "session": self.session,
            "frames": self.frames,
            "reason": self.reason,
            "error": self.error,
            "decode_errors": self.decode_errors,
            "redis_down": self.redis_down,
            "sampled_out": self.sampled_out,
        }

    @classmethod
    def from_fields(cls, fields: Fields) -> EndOfStream:
        _check_version(fields)
        return cls(
            camera=_text(fields, "camera"),
            frames=int(fields[b"frames"]),
            reason=_text(fields, "reason"),
            error=fields.get(b"error", b"").decode(),
            decode_errors=int(fields.get(b"decode_errors", b"0")),
            session=_session(fields),
            redis_down=int(fields.get(b"redis_down", b"0")),
            sampled_out=int(fields.get(b"sampled_out", b"0")),
        )


LEDGER_KINDS = ("drop", "end")


@dataclass(frozen=True)
class CameraPosition:
    """How far one camera's frames are accounted for at receipt by the worker reading it: the
    decoder session, its last seq received (each earlier one was received or its drop is in the
    ledger), the session's ``redis_down`` count seen, whether its end entry was read, and the
    stream id of the last entry received.  The next worker to read the camera starts from here
    (``StreamKeys.cursor``)."""

    session: str | None = None  # None: no frame of the camera received yet
    last_seq: int = -1
    redis_down_seen: int = 0
    ended: bool = False
    entry_id: str = "0-0"

    def received(self, entry_id: bytes | str) -> bool:
        """Whether the entry with this stream id was received already (by whoever kept this
        position): a frame that was, and never finished, is claimed without a second count."""
        return _stream_id(entry_id) <= _stream_id(self.entry_id)

    def to_fields(self) -> dict[str, str | int]:
        return {
            "v": SCHEMA_VERSION,
            "session": "" if self.session is None else self.session,
            "started": int(self.session is not None),
            "last_seq": self.last_seq,
            "redis_down_seen": self.redis_down_seen,
            "ended": int(self.ended),
            "entry_id": self.entry_id,
        }

    @classmethod
    def from_fields(cls, fields: Fields) -> CameraPosition:
        if not fields:
            return cls()
        _check_version(fields)
        return cls(
            session=fields[b"session"].decode() if fields.get(b"started") == b"1" else None,
            last_seq=int(fields[b"last_seq"]),
            redis_down_seen=int(fields[b"redis_down_seen"]),
            ended=fields.get(b"ended") == b"1",
            entry_id=fields.get(b"entry_id", b"0-0").decode(),
        )


def _stream_id(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds), int(sequence or 0)


@dataclass(frozen=True)
class LedgerEntry:
    """What became of frames that have no detection message, written before they are
    acknowledged, so that every frame of every session is accounted for in Redis, across
    crashes too: its detections, or a ``drop`` entry here.

    ``drop``: frames ``first_seq`` .. ``first_seq + count - 1`` of ``session`` dropped with
    ``cause`` (``first_seq`` -1: frames lost in decoding, which never got a seq).
    ``end``: the session ended after ``count`` frames (seq 0 .. count - 1; -1 when its decoder
    died without saying), ``cause`` the reason."""

    camera: str
    session: str
    kind: str
    first_seq: int
    count: int
    cause: str
    at: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in LEDGER_KINDS:
            raise ValueError(f"unknown ledger entry kind {self.kind!r} (known: {LEDGER_KINDS})")

    @property
    def seqs(self) -> range:
        """The seqs a drop covers (empty for an end, or frames that never got a seq)."""
        if self.kind != "drop" or self.first_seq < 0:
            return range(0)
        return range(self.first_seq, self.first_seq + self.count)

    def to_fields(self) -> dict[str, str | int]:
        return {
            "v": SCHEMA_VERSION,
            "camera": self.camera,
            "session": self.session,
            "kind": self.kind,
            "first_seq": self.first_seq,
            "count": self.count,
            "cause": self.cause,
            "at": repr(self.at),
        }

    @classmethod
    def from_fields(cls, fields: Fields) -> LedgerEntry:
        _check_version(fields)
        return cls(
            camera=_text(fields, "camera"),
            session=_session(fields),
            kind=_text(fields, "kind"),
            first_seq=int(fields[b"first_seq"]),
            count=int(fields[b"count"]),
            cause=_text(fields, "cause"),
            at=float(fields.get(b"at", b"0")),
        )


def merge_drops(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """Consecutive drops of one session and cause, in seq order, as one entry."""
    merged: list[LedgerEntry] = []
    for entry in entries:
        last = merged[-1] if merged else None
        if (
            last is not None
            and entry.kind == last.kind == "drop"
            and (entry.camera, entry.session, entry.cause)
            == (last.camera, last.session, last.cause)
            and last.first_seq >= 0
            and entry.first_seq == last.first_seq + last.count
        ):
            merged[-1] = LedgerEntry(
                last.camera,
                last.session,
                "drop",
                last.first_seq,
                last.count + entry.count,
                last.cause,
                last.at,
            )
        else:
            merged.append(entry)
    return merged


def session_progress(fields: Mapping[bytes, bytes]) -> tuple[str, int, int] | None:
    """(session, frames, redis_down) from a camera's progress hash; None when it has none."""
    if b"session" not in fields:
        return None
    return (
        fields[b"session"].decode(),
        int(fields.get(b"frames", b"0")),
        int(fields.get(b"redis_down", b"0")),
    )


@dataclass(frozen=True)
class Detection:
    """One object: box in original-frame pixels (x1, y1, x2, y2)."""

    box: tuple[float, float, float, float]
    score: float
    class_id: int
    label: str
    #: the camera's tracker's id for this object (additive to schema 1: absent reads as None);
    #: None where the camera tracks nothing, or its track is not confirmed yet
    track_id: int | None = None

    def tracked(self, track_id: int | None) -> Detection:
        """This object with ``track_id`` (``dataclasses.replace`` takes twice as long, and a
        tracked frame makes one per object)."""
        return Detection(self.box, self.score, self.class_id, self.label, track_id)

    def to_json(self) -> dict[str, Any]:
        return {
            "box": [round(v, 2) for v in self.box],
            "score": round(self.score, 5),
            "class_id": self.class_id,
            "label": self.label,
            "track_id": self.track_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Detection:
        x1, y1, x2, y2 = (float(v) for v in data["box"])
        track_id = data.get("track_id")
        return cls(
            (x1, y1, x2, y2),
            float(data["score"]),
            int(data["class_id"]),
            data["label"],
            None if track_id is None else int(track_id),
        )


@dataclass(frozen=True)
class Timestamps:
    """Epoch seconds at each stage a frame passes through."""

    captured: float
    enqueued: float
    batched: float
    inferred: float
    published: float

    def to_json(self) -> dict[str, float]:
        return {
            "captured": self.captured,
            "enqueued": self.enqueued,
            "batched": self.batched,
            "inferred": self.inferred,
            "published": self.published,
        }


_TIMESTAMP_NAMES = ("captured", "enqueued", "batched", "inferred", "published")


@dataclass(frozen=True)
class DetectionMessage:
    """The detections of one frame, published to ``<prefix>:detections:{<camera>}``."""

    camera: str
    seq: int
    pts: float | None
    width: int
    height: int
    batch_id: int
    batch_size: int
    detections: tuple[Detection, ...]
    timestamps: Timestamps
    schema: int = SCHEMA_VERSION
    session: str = ""

    @property
    def frame_id(self) -> str:
        """The frame's id, unique across restarts: at-least-once delivery de-duplicates by it."""
        return frame_id(self.session, self.seq)

    @property
    def latency_s(self) -> float:
        """End-to-end latency: decoded to published."""
        return self.timestamps.published - self.timestamps.captured

    def to_fields(self) -> dict[str, str | int]:
        stamps = {name: repr(value) for name, value in self.timestamps.to_json().items()}
        return {
            "v": self.schema,
            "camera": self.camera,
            "session": self.session,
            "frame_id": self.frame_id,
            "seq": self.seq,
            "pts": "" if self.pts is None else repr(self.pts),
            "width": self.width,
            "height": self.height,
            "batch_id": self.batch_id,
            "batch_size": self.batch_size,
            "detections": json.dumps([d.to_json() for d in self.detections]),
            **stamps,
        }

    @classmethod
    def from_fields(cls, fields: Fields) -> DetectionMessage:
        _check_version(fields)
        return cls(
            camera=_text(fields, "camera"),
            seq=int(fields[b"seq"]),
            pts=_optional_float(fields, "pts"),
            width=int(fields[b"width"]),
            height=int(fields[b"height"]),
            batch_id=int(fields[b"batch_id"]),
            batch_size=int(fields[b"batch_size"]),
            detections=tuple(Detection.from_json(d) for d in json.loads(fields[b"detections"])),
            timestamps=Timestamps(*(float(fields[name.encode()]) for name in _TIMESTAMP_NAMES)),
            session=_session(fields),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``framebatch consume`` line."""
        return {
            "schema": self.schema,
            "camera": self.camera,
            "session": self.session,
            "frame_id": self.frame_id,
            "seq": self.seq,
            "pts": self.pts,
            "width": self.width,
            "height": self.height,
            "batch_id": self.batch_id,
            "batch_size": self.batch_size,
            "detections": [d.to_json() for d in self.detections],
            "timestamps": self.timestamps.to_json(),
        }
