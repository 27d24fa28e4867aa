"""What a camera's analytics carries from one frame to the next (and from one worker to the
next, through Redis: :mod:`pipeline.analytics.store`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.analytics.lines import LineState
from pipeline.analytics.zones import ZoneState

if TYPE_CHECKING:  # the tracker library is imported only by cameras that track
    from pipeline.analytics.tracking import TrackerState


@dataclass
class TrackInfo:
    """What events say of a track: its class, score and box when last seen, when it began."""

    class_id: int
    score: float
    box: tuple[float, float, float, float]
    started: float  # stream seconds
    seen: float


@dataclass
class CameraState:
    session: str = ""
    last_seq: int = -1
    last_time: float | None = None  # stream seconds of the last frame analysed
    tracker: TrackerState | None = None
    lines: dict[str, LineState] = field(default_factory=dict)
    zones: dict[str, ZoneState] = field(default_factory=dict)
