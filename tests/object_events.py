"""A sample analytics event for tests: a car crossing a line, with any field changed."""

from __future__ import annotations

from typing import Any

from streams.object_events import ObjectEvent


def sample_event(**changes: Any) -> ObjectEvent:
    values: dict[str, Any] = dict(
        kind="line_cross",
        camera="gate-1",
        session="ab12",
        seq=41,
        index=2,
        pts=1.4,
        time=1_700_000_000.25,
        track_id=7,
        class_id=2,
        label="car",
        score=0.875,
        box=(10.0, 20.5, 110.25, 220.0),
        region="north",
        direction="in",
        dwell_s=None,
    )
    return ObjectEvent(**{**values, **changes})
