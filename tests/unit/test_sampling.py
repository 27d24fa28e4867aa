"""Frame sampling (``vid_stride``, ``max_fps``), table-driven."""

from __future__ import annotations

import pytest

from streams.sampling import FrameSampler


def taken(sampler: FrameSampler, times: list[float]) -> list[int]:
    return [i for i, at in enumerate(times) if sampler.take(at)]


def frames(fps: float, seconds: float, start: float = 0.0) -> list[float]:
    return [start + i / fps for i in range(round(fps * seconds))]


@pytest.mark.parametrize(
    ("vid_stride", "max_fps", "fps", "expected_per_s"),
    [
        (1, None, 30, 30),  # everything
        (3, None, 30, 10),
        (1, 7, 30, 7),
        (1, 10, 30, 10),
        (1, 15, 29.97, 15),
        (1, 7, 5, 5),  # a slower stream than the cap keeps every frame
        (2, 5, 30, 5),  # both: the cap after the stride
        (1, 0.5, 30, 0.5),
    ],
)
def test_rate_taken(vid_stride, max_fps, fps, expected_per_s):
    sampler = FrameSampler(vid_stride=vid_stride, max_fps=max_fps)
    seconds = 20
    count = len(taken(sampler, frames(fps, seconds)))
    assert abs(count - expected_per_s * seconds) <= 1


def test_kept_frames_are_evenly_spaced():
    kept = taken(FrameSampler(max_fps=10), frames(30, 2))
    assert kept == list(range(0, 60, 3))


def test_a_loop_or_a_clock_going_back_restarts_the_grid():
    sampler = FrameSampler(max_fps=5)
    first = taken(sampler, frames(30, 1))
    again = taken(sampler, frames(30, 1))  # a looped file: pts starts at 0 again
    assert first == again == [0, 6, 12, 18, 24]


def test_a_gap_in_time_restarts_the_grid_at_the_next_frame():
    sampler = FrameSampler(max_fps=2)
    times = [*frames(10, 1), *frames(10, 1, start=100.0)]
    assert taken(sampler, times) == [0, 5, 10, 15]


@pytest.mark.parametrize(("vid_stride", "max_fps"), [(0, None), (1, 0.0), (1, -1.0)])
def test_bad_settings_are_refused(vid_stride, max_fps):
    with pytest.raises(ValueError):
        FrameSampler(vid_stride=vid_stride, max_fps=max_fps)
