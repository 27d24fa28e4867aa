"""Frame sampling (``vid_stride``, ``max_fps``), table-driven."""

from __future__ import annotations

import pytest

from streams.sampling import FrameSampler, KeyframeGate


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


def gate_decisions(gate: KeyframeGate, packets) -> list[bool]:
    """Whether each (key, at) packet is skipped."""
    return [gate.skip(key=key, at=at) for key, at in packets]


def gop_stream(gop: int, fps: float, frames: int):
    return [(i % gop == 0, i / fps) for i in range(frames)]


def test_auto_skips_non_key_frames_once_the_gop_fits_in_the_sampling_period():
    # a key frame every 0.5 s, sampled at 1 frame/s: the first GOP is decoded whole (measured)
    skipped = gate_decisions(KeyframeGate("auto", max_fps=1.0), gop_stream(15, 30.0, 60))
    assert not any(skipped[:16]) and skipped[16:30] == [True] * 14
    assert [s for i, s in enumerate(skipped) if i % 15 == 0] == [False] * 4  # keys: never


@pytest.mark.parametrize(
    ("gate", "why"),
    [
        (KeyframeGate("auto", max_fps=1.0), "a 2 s GOP gives fewer frames than 1 a second"),
        (KeyframeGate("auto"), "no max_fps: every frame may be taken"),
        (KeyframeGate("auto", max_fps=1.0, vid_stride=2), "vid_stride counts decoded frames"),
        (KeyframeGate("all", max_fps=0.1), "told to decode all"),
    ],
)
def test_every_frame_is_decoded_where_key_frames_alone_are_not_enough(gate, why):
    assert not any(gate_decisions(gate, gop_stream(60, 30.0, 240))), why


def test_keyframes_mode_skips_from_the_start_and_auto_follows_a_gop_that_grows():
    assert gate_decisions(KeyframeGate("keyframes"), gop_stream(3, 30.0, 6)) == [
        False,
        True,
        True,
        False,
        True,
        True,  # fmt: skip
    ]
    gate = KeyframeGate("auto", max_fps=2.0)
    gate_decisions(gate, gop_stream(10, 30.0, 30))  # 1/3 s GOP: key frames only
    assert gate.keyframes_only
    gate_decisions(gate, [(True, 1.0), (True, 3.0)])  # the camera's GOP is now 2 s
    assert not gate.keyframes_only
