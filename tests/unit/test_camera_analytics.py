"""A camera's analytics on synthetic detections: filters and masks, track ids, events, and a
state that carries on through Redis as if nothing had happened (pure logic)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from pipeline.analytics.camera import CameraAnalytics
from pipeline.analytics.store import StateUnreadable, dump_state, load_state
from pipeline.config.analytics import AnalyticsConfig
from pipeline.errors import BadInput
from streams.messages import Detection, DetectionMessage, Timestamps

LABELS = ("person", "bicycle", "car")


def label(class_id: int) -> str:
    return LABELS[class_id]


def frame(seq: int, boxes, *, session: str = "s1", fps: float = 10.0) -> DetectionMessage:
    detections = tuple(
        Detection(tuple(float(v) for v in box), score, cls, label(cls)) for box, score, cls in boxes
    )
    stamps = Timestamps(1000.0 + seq / fps, 0, 0, 0, 0)
    return DetectionMessage(
        camera="cam",
        seq=seq,
        pts=seq / fps,
        width=960,
        height=540,
        batch_id=0,
        batch_size=1,
        detections=detections,
        timestamps=stamps,
        session=session,
    )


def car_going_down(step: int, x: float = 400.0):
    y = 100 + 20 * step
    return ([x, y, x + 60, y + 40], 0.9, 2)


CONFIG = {
    "tracker": {},
    "lines": {"gate": {"start": [0, 300], "end": [960, 300]}},
    "zones": {"bay": {"polygon": [[0, 350], [960, 350], [960, 540], [0, 540]], "loiter_s": 0.5}},
}


def analytics(config=CONFIG, state=None) -> CameraAnalytics:
    return CameraAnalytics(
        "cam", AnalyticsConfig.model_validate(config), label=label, classes=3, state=state
    )


def run(camera: CameraAnalytics, frames):
    return [camera.analyse(f) for f in frames]


def scene(steps: int = 35):
    """A car driving down through the line into the bay, then leaving the picture."""
    return [frame(i, [car_going_down(i)] if i < 20 else []) for i in range(steps)]


def test_a_car_through_a_line_into_a_zone_makes_these_events():
    results = run(analytics(), scene())
    events = [(e.seq, e.kind, e.region, e.direction) for r in results for e in r.events]
    assert events[0] == (1, "track_start", "", "")
    crossing = [e for e in events if e[1] == "line_cross"]
    assert crossing == [(9, "line_cross", "gate", "out")]  # down across a left→right line
    kinds = [e[1] for e in events]
    assert kinds == ["track_start", "line_cross", "zone_enter", "loiter", "zone_exit", "track_end"]
    ids = {d.track_id for r in results for d in r.message.detections}
    assert ids == {None, 0}  # unconfirmed on its first frame, then one id
    (end,) = [e for r in results for e in r.events if e.kind == "track_end"]
    assert end.dwell_s == pytest.approx(1.8)  # confirmed in frame 1, last seen in frame 19
    assert 19 < end.seq <= 30  # ended once unseen for lost_track_s (1 s: 10 frames)


@pytest.mark.parametrize("cut", [1, 5, 11, 12, 16, 21])
def test_the_state_through_redis_changes_nothing(cut):
    frames = scene()
    whole = run(analytics(), frames)
    first = analytics()
    before = run(first, frames[:cut])
    carried = analytics(state=load_state(dump_state(first.state)))
    after = run(carried, frames[cut:])
    assert [r.events for r in before + after] == [r.events for r in whole]
    assert [r.message for r in before + after] == [r.message for r in whole]


def test_a_new_session_ends_every_track_and_ids_go_on():
    camera = analytics({"tracker": {}})
    run(camera, [frame(i, [car_going_down(i)]) for i in range(5)])
    restarted = run(camera, [frame(i, [car_going_down(i)], session="s2") for i in range(5)])
    first = restarted[0].events
    assert [e.kind for e in first] == ["track_end"] and first[0].track_id == 0
    ids = {d.track_id for r in restarted for d in r.message.detections} - {None}
    assert ids == {1}


def test_filters_and_masks_leave_out_what_they_name():
    config = {
        "filters": {"classes": ["car"], "min_score": 0.5, "min_area": 100},
        "masks": [[[0, 0], [300, 0], [300, 540], [0, 540]]],
    }
    kept = analytics(config).analyse(
        frame(
            0,
            [
                ([400, 100, 460, 140], 0.9, 2),  # kept
                ([400, 100, 460, 140], 0.9, 0),  # a person: not in classes
                ([400, 100, 460, 140], 0.3, 2),  # score too low
                ([400, 100, 405, 105], 0.9, 2),  # 25 px²
                ([100, 100, 160, 140], 0.9, 2),  # anchor under the mask
            ],
        )
    )
    assert [d.box for d in kept.message.detections] == [(400.0, 100.0, 460.0, 140.0)]
    assert kept.message.detections[0].track_id is None  # no tracker: no ids
    assert kept.events == ()


def test_a_class_the_model_lacks_is_bad_input_named():
    with pytest.raises(BadInput, match=r"filters\.classes\[1\].*'kangaroo'"):
        analytics({"filters": {"classes": ["car", "kangaroo"]}})


def test_a_zone_outside_the_frames_is_bad_input_named():
    config = {"tracker": {}, "zones": {"far": {"polygon": [[0, 0], [2000, 0], [0, 900]]}}}
    with pytest.raises(BadInput, match=r"zones\.far: point \[2000, 0\] is outside .*960x540"):
        analytics(config).analyse(frame(0, []))


def test_a_normalized_line_shorter_than_a_pixel_of_the_frames_is_bad_input_named():
    # ends one ulp apart pass the config's check and are one pixel at 960 wide: a line
    # counter cannot be made of them (it stopped the whole daemon at the first frame)
    x = 0.22169166627303505
    config = {
        "coordinates": "normalized",
        "tracker": {},
        "lines": {"l": {"start": [x, 0.5], "end": [x + 3e-17, 0.5]}},
    }
    assert config["lines"]["l"]["start"] != config["lines"]["l"]["end"]
    with pytest.raises(BadInput, match=r"lines\.l: 0 pixels long .*960x540 frames"):
        analytics(config).analyse(frame(0, []))


def test_a_normalized_zone_of_less_than_a_pixel_is_bad_input_named():
    config = {
        "coordinates": "normalized",
        "tracker": {},
        "zones": {"dot": {"polygon": [[0.5, 0.5], [0.5004, 0.5], [0.5, 0.5004]]}},
    }
    with pytest.raises(BadInput, match=r"zones\.dot: covers 0 square pixels"):
        analytics(config).analyse(frame(0, []))


@pytest.mark.parametrize(
    ("regions", "where", "message"),
    [
        ({"lines": {"l": {"start": [10, 10], "end": [10.5, 10]}}}, "lines.l.end", "one pixel"),
        (
            {"zones": {"dot": {"polygon": [[10, 10], [10.4, 10], [10, 10.4]]}}},
            "zones.dot.polygon",
            "less than one square pixel",
        ),
        ({"masks": [[[10, 10], [10.4, 10], [10, 10.4]]]}, "masks.0", "less than one square pixel"),
        (
            {
                "lines": {"gate": {"start": [0, 0], "end": [10, 10]}},
                "zones": {"gate": {"polygon": [[0, 0], [9, 0], [0, 9]]}},
            },
            "lines.gate",
            "a zone has this name too",
        ),
    ],
)
def test_regions_no_event_could_tell_apart_are_refused_by_the_config(regions, where, message):
    with pytest.raises(ValidationError) as raised:
        AnalyticsConfig.model_validate({"tracker": {}, **regions})
    (error,) = raised.value.errors()
    assert ".".join(map(str, error["loc"])) == where and message in error["msg"]


def test_normalized_regions_scale_with_the_frames():
    config = {
        "coordinates": "normalized",
        "tracker": {},
        "lines": {"gate": {"start": [0, 0.5555], "end": [1, 0.5555]}},
    }
    events = [e for r in run(analytics(config), scene()) for e in r.events]
    assert [(e.seq, e.kind) for e in events if e.kind == "line_cross"] == [(9, "line_cross")]


def test_event_ids_are_the_frames_and_stable():
    events = [e for r in run(analytics(), scene()) for e in r.events]
    again = [e for r in run(analytics(), scene()) for e in r.events]
    assert [e.id for e in events] == [e.id for e in again]
    assert len({e.id for e in events}) == len(events)
    assert all(e.id.startswith(f"s1:{e.seq}:") for e in events)


def test_events_carry_the_running_counts():
    events = [e for r in run(analytics(), scene()) for e in r.events]
    counted = {e.kind: e.count for e in events if e.count is not None}
    assert counted == {"line_cross": 1, "zone_enter": 1, "zone_exit": 0}
    assert all(e.count is None for e in events if e.kind in ("track_start", "track_end", "loiter"))


def test_a_lost_track_leaves_its_zone_when_it_was_last_seen():
    events = [e for r in run(analytics(), scene()) for e in r.events]
    (enter,) = [e for e in events if e.kind == "zone_enter"]
    (leave,) = [e for e in events if e.kind == "zone_exit"]
    assert leave.seq > 20  # reported when the tracker gives the track up...
    assert leave.dwell_s == pytest.approx(1.9 - enter.pts)  # ...dwelling until frame 19


def test_new_tracker_settings_end_the_tracks_of_a_carried_state():
    first = analytics()
    run(first, scene()[:8])
    changed = {**CONFIG, "tracker": {"lost_track_s": 3.0}}
    carried = analytics(changed, state=load_state(dump_state(first.state)))
    after = run(carried, scene()[8:12])
    assert [e.kind for e in after[0].events][:1] == ["track_end"]
    ids = {d.track_id for r in after for d in r.message.detections} - {None}
    assert ids == {1}  # a new track; ids go on
    assert carried.state.tracker.config.lost_track_s == 3.0


def test_a_line_carried_into_a_longer_hysteresis_keeps_counting():
    first = analytics()
    run(first, scene()[:6])
    longer = {**CONFIG, "lines": {"gate": {**CONFIG["lines"]["gate"], "min_crossing_frames": 3}}}
    carried = analytics(longer, state=load_state(dump_state(first.state)))
    events = [e for r in run(carried, scene()[6:]) for e in r.events]
    # on the new side from frame 8: two frames in a row (the default) count it in frame 9,
    # three in frame 10
    assert [(e.seq, e.kind) for e in events if e.kind == "line_cross"] == [(10, "line_cross")]


def test_a_damaged_state_is_refused_with_the_reason():
    blob = dump_state(analytics().state)
    with pytest.raises(StateUnreadable, match="unreadable"):
        load_state(blob[:-10])
    with pytest.raises(StateUnreadable, match="another version"):
        load_state(b"framebatch-analytics/1/trackers-2.0\n" + blob.split(b"\n", 1)[1])


def test_regions_that_do_not_fit_leave_the_state_as_it_was():
    config = {"tracker": {}, "zones": {"far": {"polygon": [[0, 0], [950, 0], [0, 530]]}}}
    camera = analytics(config)
    run(camera, [frame(i, [car_going_down(i)]) for i in range(3)])
    smaller = replace(frame(3, [car_going_down(3)]), width=640, height=360)
    with pytest.raises(BadInput):
        camera.analyse(smaller)
    assert camera.state.last_seq == 2
