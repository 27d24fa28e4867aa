"""Line and zone counting against supervision's own LineZone and PolygonZone, on random
trajectories (pure logic: no pipeline)."""

from __future__ import annotations

import numpy as np
import pytest
import supervision as sv
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.analytics.geometry import anchors
from pipeline.analytics.lines import LineCounter, LineState
from pipeline.analytics.zones import ZoneCounter

LINE = ((100.0, 300.0), (800.0, 320.0))


def random_frames(draw, tracks: int, frames: int):
    """Boxes of a few tracks walking about the line, some frames missing some tracks."""
    positions = {t: [draw(st.floats(50, 850)), draw(st.floats(150, 450))] for t in range(tracks)}
    out = []
    for _ in range(frames):
        ids, boxes, classes = [], [], []
        for track, (x, y) in positions.items():
            positions[track] = [
                x + draw(st.floats(-30, 30)),
                y + draw(st.sampled_from([-40.0, -8.0, -1.0, 0.0, 1.0, 8.0, 40.0])),
            ]
            if draw(st.booleans()) or draw(st.booleans()):  # present 3 frames in 4
                ids.append(track)
                boxes.append([x - 20, y - 40, x + 20, y])
                classes.append(track % 3)
        out.append(
            (
                np.array(ids, dtype=int),
                np.array(boxes, dtype=float).reshape(-1, 4),
                np.array(classes, dtype=int),
            )
        )
    return out


@st.composite
def trajectories(draw):
    return random_frames(draw, draw(st.integers(1, 5)), draw(st.integers(1, 40)))


@settings(max_examples=300, deadline=None)
@given(frames=trajectories(), min_frames=st.integers(1, 4))
def test_line_crossings_are_supervisions(frames, min_frames):
    ours = LineCounter(*LINE, min_frames)
    theirs = sv.LineZone(
        sv.Point(*LINE[0]),
        sv.Point(*LINE[1]),
        triggering_anchors=(sv.Position.BOTTOM_CENTER,),
        minimum_crossing_threshold=min_frames,
    )
    for ids, boxes, classes in frames:
        detections = sv.Detections(xyxy=boxes, class_id=classes, tracker_id=ids)
        crossed_in, crossed_out = theirs.trigger(detections)
        got = ours.update(ids, classes, anchors(detections, "bottom_center"))
        assert sorted(got) == sorted(
            [(i, "in") for i in np.flatnonzero(crossed_in)]
            + [(i, "out") for i in np.flatnonzero(crossed_out)]
        )
    counts = ours.state.counts
    assert {c: n for (d, c), n in counts.items() if d == "in"} == theirs.in_count_per_class
    assert {c: n for (d, c), n in counts.items() if d == "out"} == theirs.out_count_per_class


def test_a_box_jittering_on_the_line_counts_once():
    line = LineCounter((0.0, 100.0), (200.0, 100.0), 2)
    ys = [80, 90, 105, 98, 103, 97, 110, 120, 130, 95, 130, 140]  # across once, jitter on it
    crossings = []
    for y in ys:
        crossings += line.update(np.array([7]), np.array([2]), np.array([[50.0, float(y)]]))
    assert [d for _, d in crossings] == ["out"]
    assert line.state.counts == {("out", 2): 1}


def test_a_line_state_carries_on_in_a_new_counter():
    first = LineCounter((0.0, 100.0), (200.0, 100.0), 2)
    for y in (80, 90):
        first.update(np.array([1]), np.array([0]), np.array([[50.0, float(y)]]))
    second = LineCounter((0.0, 100.0), (200.0, 100.0), 2, state=first.state)
    crossings = []
    for y in (110, 120, 130):
        crossings += second.update(np.array([1]), np.array([0]), np.array([[50.0, float(y)]]))
    assert crossings == [(0, "out")]
    assert isinstance(second.state, LineState)


def test_a_line_state_carried_into_a_shorter_hysteresis_keeps_the_newest_sides():
    state = LineState(history={7: (False, True, True, True)}, confirmed={7: False})
    counter = LineCounter((0.0, 100.0), (200.0, 100.0), 1, state=state)
    assert state.history == {7: (True, True)}
    # the track is on the far side already: its next frame there confirms it, counted once
    crossings = counter.update(np.array([7]), np.array([0]), np.array([[50.0, 80.0]]))
    crossings += counter.update(np.array([7]), np.array([0]), np.array([[50.0, 70.0]]))
    assert crossings == [(0, "in")]


@settings(max_examples=200, deadline=None)
@given(frames=trajectories())
def test_zone_occupancy_with_no_inertia_is_polygon_zones_count(frames):
    polygon = np.array([[200, 200], [700, 180], [760, 420], [150, 400]])
    zone = sv.PolygonZone(polygon)
    counter = ZoneCounter(inertia=1, loiter_s=None)
    for step, (ids, boxes, classes) in enumerate(frames):
        detections = sv.Detections(xyxy=boxes, class_id=classes, tracker_id=ids)
        inside = zone.trigger(detections) if len(detections) else np.zeros(0, dtype=bool)
        counter.update(ids, classes, inside, float(step))
        # every track seen this frame is where PolygonZone puts it; absent ones stay put
        for track, is_in in zip(ids, inside, strict=True):
            assert (int(track) in counter.state.inside) == bool(is_in)
    state = counter.state
    assert sum(state.entries.values()) - sum(state.exits.values()) == len(state.inside)


@pytest.mark.parametrize(
    ("path", "inertia", "enters", "exits"),
    [
        ([0, 1, 1, 1, 0, 0, 0], 1, 1, 1),
        ([0, 1, 0, 1, 0, 1, 0], 2, 0, 0),  # flicker below the inertia: nothing
        ([0, 1, 1, 0, 1, 1, 0, 0], 2, 1, 1),  # one frame out is not an exit
    ],
)
def test_zone_inertia(path, inertia, enters, exits):
    counter = ZoneCounter(inertia=inertia, loiter_s=None)
    kinds = []
    for step, is_in in enumerate(path):
        changes = counter.update(np.array([3]), np.array([0]), np.array([bool(is_in)]), step)
        kinds += [kind for kind, *_ in changes]
    assert kinds.count("zone_enter") == enters
    assert kinds.count("zone_exit") == exits


def test_loitering_is_said_once_per_visit_with_its_dwell():
    counter = ZoneCounter(inertia=1, loiter_s=2.5, state=None)
    changes = []
    for step in range(6):
        changes += counter.update(np.array([4]), np.array([0]), np.array([True]), float(step))
    changes += counter.update(np.array([4]), np.array([0]), np.array([False]), 6.0)
    assert [(kind, dwell) for kind, _, _, dwell in changes] == [
        ("zone_enter", None),
        ("loiter", 3.0),
        ("zone_exit", 6.0),
    ]
