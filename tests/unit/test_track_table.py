"""A tracker's tracks written as a table (pure logic, on the tracker library's own objects):
read back, they go on exactly as the tracks that were never written."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from framebatch_tools.bench.analytics import SETTINGS, scene
from pipeline.analytics import track_table
from pipeline.analytics.camera import CameraAnalytics
from pipeline.analytics.store import dump_state, load_state
from pipeline.config.analytics import AnalyticsConfig

CONFIG = AnalyticsConfig.model_validate(SETTINGS)


def camera(state=None) -> CameraAnalytics:
    return CameraAnalytics("bench", CONFIG, label=lambda c: "car", classes=80, state=state)


def tracks_after(frames: int, objects: int = 30):
    analytics = camera()
    for message in scene(objects, frames):
        analytics.analyse(message)
    return analytics.state.tracker.tracker.tracks


def test_many_tracks_carried_through_the_state_at_every_frame_change_nothing():
    messages = scene(30, 90)
    whole = camera()
    expected = [whole.analyse(m) for m in messages]
    carried, results = camera(), []
    for message in messages:  # a new worker every frame: the worst case for the table
        carried = camera(load_state(dump_state(carried.state)))
        results.append(carried.analyse(message))
    assert [r.events for r in results] == [r.events for r in expected]
    assert [r.message for r in results] == [r.message for r in expected]
    assert sum(len(r.events) for r in expected) > 30  # tracks began, crossed, entered


def test_tracks_read_back_hold_every_value_and_the_filters_references():
    tracks = tracks_after(45)
    table = track_table.pack(tracks)
    assert table is not None and len(table.groups) >= 1
    back = table.unpack()
    assert len(back) == len(tracks)
    for before, after in zip(tracks, back, strict=True):
        assert type(after) is type(before) and after is not before
        assert after.tracker_id == before.tracker_id and after.age == before.age
        kf_before, kf_after = before.state_estimator.kf, after.state_estimator.kf
        np.testing.assert_array_equal(kf_after.state, kf_before.state)
        np.testing.assert_array_equal(kf_after.state_covariance, kf_before.state_covariance)
        np.testing.assert_array_equal(kf_after.process_noise, kf_before.process_noise)
        assert kf_after.state_prior is kf_after.state  # as after a step
        assert kf_after.state is not kf_before.state  # never shared with the live tracks


def test_tracks_of_two_layouts_come_back_in_their_places():
    tracks = tracks_after(45)
    fresh = tracks_after(1)  # a track that has not stepped lacks the motion model's caches
    mixed = [tracks[0], fresh[0], tracks[1]]
    table = track_table.pack(mixed)
    assert table is not None and len(table.groups) == 2
    back = table.unpack()
    assert [t.tracker_id for t in back] == [t.tracker_id for t in mixed]
    assert [vars(t.state_estimator.motion).keys() for t in back] == [
        vars(t.state_estimator.motion).keys() for t in mixed
    ]


@pytest.mark.parametrize("tracks", [[object()], [{"not": "a track"}]])
def test_what_is_not_the_librarys_tracks_is_not_a_table(tracks):
    assert track_table.pack(tracks) is None


def test_no_tracks_is_an_empty_table():
    assert track_table.pack([]).unpack() == []


def test_a_track_with_one_attribute_swapped_for_another_is_not_read_with_a_known_layout():
    tracks = tracks_after(45)
    assert track_table.pack(tracks) is not None  # its layout is known now
    odd = copy.deepcopy(tracks[0])
    kalman = odd.state_estimator.kf
    del kalman.dim_z  # as many attributes as the known layout, one of them another
    kalman.extra = np.arange(3.0)
    back = track_table.pack([tracks[1], odd]).unpack()
    assert back[1].state_estimator.kf.extra.tolist() == [0.0, 1.0, 2.0]
    assert not hasattr(back[1].state_estimator.kf, "dim_z")
    assert back[0].state_estimator.kf.dim_z == tracks[1].state_estimator.kf.dim_z


def test_a_track_with_an_attribute_more_is_not_read_with_a_known_layout():
    tracks = tracks_after(45)
    assert track_table.pack(tracks) is not None
    odd = copy.deepcopy(tracks[0])
    odd.state_estimator.motion.note = "kept"
    back = track_table.pack([odd, tracks[1]]).unpack()
    assert back[0].state_estimator.motion.note == "kept"
    assert not hasattr(back[1].state_estimator.motion, "note")


def test_a_track_lacking_an_attribute_its_class_also_has_is_not_read_with_a_known_layout():
    # the motion model's caches have class defaults: a read of the missing one finds the
    # class's, so the number of attributes and the reads alone would take the track as known
    tracks = tracks_after(45)
    assert track_table.pack(tracks) is not None
    odd = copy.deepcopy(tracks[0])
    motion = odd.state_estimator.motion
    assert hasattr(type(motion), "cached_step")
    del motion.cached_step
    motion.extra = "kept"
    back = track_table.pack([tracks[1], odd]).unpack()
    assert back[1].state_estimator.motion.extra == "kept"
    assert "cached_step" not in vars(back[1].state_estimator.motion)
