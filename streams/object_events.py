"""Analytics events on the wire: one :class:`ObjectEvent` per entry of
``<prefix>:events:{<camera>}``.

An event's ``id`` is made from the frame it happened in and its place among that frame's events,
so the same frame analysed again (a worker that died before acknowledging it) makes the same ids:
outputs that deliver at least once (MQTT, webhooks) give receivers the id to de-duplicate by.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from streams.messages import SCHEMA_VERSION, Fields, frame_id

EventKind = Literal["track_start", "track_end", "zone_enter", "zone_exit", "line_cross", "loiter"]
EVENT_KINDS: tuple[EventKind, ...] = (
    "track_start",
    "track_end",
    "zone_enter",
    "zone_exit",
    "line_cross",
    "loiter",
)


class NewerSchema(ValueError):
    """An event a newer framebatch wrote (a rolling upgrade): for a newer reader, not lost."""


@dataclass(frozen=True)
class ObjectEvent:
    """Something a tracked object did in one frame of one camera."""

    kind: EventKind
    camera: str
    session: str
    seq: int  # the frame's
    index: int  # among the frame's events: makes the id
    pts: float | None
    time: float  # epoch seconds the frame was captured
    track_id: int
    class_id: int
    label: str
    score: float
    box: tuple[float, float, float, float]  # source-frame pixels; the last seen for track_end
    region: str = ""  # the zone's or line's name
    direction: str = ""  # line_cross: "in" or "out"
    dwell_s: float | None = None  # zone_exit, loiter: time in the zone; track_end: track's age
    #: line_cross: the line's crossings that way of this class so far (this one included);
    #: zone_enter, zone_exit: tracks of this class in the zone after it. Outputs publish counts
    #: from it, so a count topic is right after any restart without state of its own.
    count: int | None = None
    #: the event's JPEG, relative to the snapshots folder ("" when none was taken)
    snapshot: str = ""
    schema: int = SCHEMA_VERSION

    @property
    def frame_id(self) -> str:
        return frame_id(self.session, self.seq)

    @property
    def id(self) -> str:
        """Unique across restarts, the same when a frame is analysed again."""
        return f"{self.frame_id}:{self.index}"

    def to_fields(self) -> dict[str, str | int]:
        return {
            "v": self.schema,
            "id": self.id,
            "kind": self.kind,
            "camera": self.camera,
            "session": self.session,
            "seq": self.seq,
            "index": self.index,
            "pts": "" if self.pts is None else repr(self.pts),
            "time": repr(self.time),
            "track_id": self.track_id,
            "class_id": self.class_id,
            "label": self.label,
            "score": repr(self.score),
            "box": json.dumps([round(v, 2) for v in self.box]),
            "region": self.region,
            "direction": self.direction,
            "dwell_s": "" if self.dwell_s is None else repr(self.dwell_s),
            "count": "" if self.count is None else self.count,
            "snapshot": self.snapshot,
        }

    @classmethod
    def from_fields(cls, fields: Fields) -> ObjectEvent:
        version = int(fields.get(b"v", b"0"))
        if version > SCHEMA_VERSION:
            raise NewerSchema(f"event schema version {version}: written by a newer framebatch")
        if version != SCHEMA_VERSION:
            raise ValueError(f"unsupported event schema version {version}")

        def text(name: str) -> str:
            return fields.get(name.encode(), b"").decode()

        def optional(name: str) -> float | None:
            return float(text(name)) if text(name) else None

        x1, y1, x2, y2 = (float(v) for v in json.loads(text("box")))
        kind = text("kind")
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind[:40]!r}")
        return cls(
            kind=kind,  # type: ignore[arg-type]
            camera=text("camera"),
            session=text("session"),
            seq=int(text("seq")),
            index=int(text("index")),
            pts=optional("pts"),
            time=float(text("time")),
            track_id=int(text("track_id")),
            class_id=int(text("class_id")),
            label=text("label"),
            score=float(text("score")),
            box=(x1, y1, x2, y2),
            region=text("region"),
            direction=text("direction"),
            dwell_s=optional("dwell_s"),
            count=int(text("count")) if text("count") else None,
            snapshot=text("snapshot"),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``framebatch consume --events`` line, and the body outputs send."""
        return {
            "schema": self.schema,
            "id": self.id,
            "kind": self.kind,
            "camera": self.camera,
            "frame_id": self.frame_id,
            "pts": self.pts,
            "time": self.time,
            "track_id": self.track_id,
            "class_id": self.class_id,
            "label": self.label,
            "score": round(self.score, 5),
            "box": [round(v, 2) for v in self.box],
            "region": self.region or None,
            "direction": self.direction or None,
            "dwell_s": None if self.dwell_s is None else round(self.dwell_s, 3),
            "count": self.count,
            "snapshot": self.snapshot or None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ObjectEvent:
        session, seq, index = str(data["id"]).rsplit(":", 2)
        x1, y1, x2, y2 = (float(v) for v in data["box"])
        return cls(
            kind=data["kind"],
            camera=data["camera"],
            session=session,
            seq=int(seq),
            index=int(index),
            pts=data.get("pts"),
            time=float(data["time"]),
            track_id=int(data["track_id"]),
            class_id=int(data["class_id"]),
            label=data["label"],
            score=float(data["score"]),
            box=(x1, y1, x2, y2),
            region=data.get("region") or "",
            direction=data.get("direction") or "",
            dwell_s=data.get("dwell_s"),
            count=data.get("count"),
            snapshot=data.get("snapshot") or "",
        )
