"""Analytics events on the wire: fields and JSON lines round-trip, ids are the frame's."""

from __future__ import annotations

import json

import pytest

from streams.object_events import ObjectEvent
from tests.object_events import sample_event

event = sample_event


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"pts": None},
        {"kind": "zone_exit", "direction": "", "dwell_s": 3.5},
        {"kind": "track_start", "region": ""},
    ],
)
def test_an_event_round_trips(changes):
    original = event(**changes)
    stored = {k.encode(): str(v).encode() for k, v in original.to_fields().items()}
    assert ObjectEvent.from_fields(stored) == original
    line = json.loads(json.dumps(original.to_json()))
    assert ObjectEvent.from_json(line) == original


def test_the_id_is_the_frame_and_the_place_among_its_events():
    assert event().id == "ab12:41:2"
    assert event().to_json()["frame_id"] == "ab12:41"


def test_an_unknown_kind_is_refused():
    stored = {k.encode(): str(v).encode() for k, v in event().to_fields().items()}
    stored[b"kind"] = b"teleported"
    with pytest.raises(ValueError, match="unknown event kind"):
        ObjectEvent.from_fields(stored)
