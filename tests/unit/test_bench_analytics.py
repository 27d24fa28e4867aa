"""``framebatch bench-analytics`` measures what it says: its scene has objects crossing the
line and entering the zone, so the analytics it times is doing its work."""

from __future__ import annotations

from framebatch_tools.bench.analytics import measure, scene


def test_the_scene_keeps_its_objects_in_view():
    messages = scene(7, 40)
    assert all(len(m.detections) == 7 for m in messages)
    assert messages[-1].pts > messages[0].pts


def test_the_measured_analytics_makes_events_and_a_state():
    empty = measure(0, 40, repeats=1)
    busy = measure(10, 120, repeats=1)
    assert empty["events_per_frame"] == 0
    assert busy["events_per_frame"] > 0  # crossings, entries: the stage is not idle
    assert busy["state_bytes"] > empty["state_bytes"]
    assert busy["total_ms_per_frame"] > 0
