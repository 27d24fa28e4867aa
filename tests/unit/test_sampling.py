"""Frame sampling (``vid_stride``, ``max_fps``), table-driven."""

from __future__ import annotations

import pytest

from streams.sampling import DecodeGate, FrameSampler


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


def gate_decisions(gate: DecodeGate, packets) -> list[bool]:
    """Whether each (key, at) packet is skipped."""
    return [gate.skip(key=key, at=at) for key, at in packets]


def gop_stream(gop: int, fps: float, frames: int):
    return [(i % gop == 0, i / fps) for i in range(frames)]


def test_auto_skips_non_key_frames_once_the_gop_fits_in_the_sampling_period():
    # a key frame every 0.5 s, sampled at 1 frame/s: the first GOP is decoded whole (measured)
    skipped = gate_decisions(DecodeGate("auto", max_fps=1.0), gop_stream(15, 30.0, 60))
    assert not any(skipped[:16]) and skipped[16:30] == [True] * 14
    assert [s for i, s in enumerate(skipped) if i % 15 == 0] == [False] * 4  # keys: never


@pytest.mark.parametrize(
    ("gate", "why"),
    [
        (DecodeGate("auto", max_fps=1.0), "a 2 s GOP gives fewer frames than 1 a second"),
        (DecodeGate("auto"), "no max_fps: every frame may be taken"),
        (DecodeGate("auto", max_fps=1.0, vid_stride=2), "vid_stride counts decoded frames"),
        (DecodeGate("all", max_fps=0.1), "told to decode all"),
    ],
)
def test_every_frame_is_decoded_where_key_frames_alone_are_not_enough(gate, why):
    assert not any(gate_decisions(gate, gop_stream(60, 30.0, 240))), why


def test_keyframes_mode_skips_from_the_start_and_auto_follows_a_gop_that_grows():
    assert gate_decisions(DecodeGate("keyframes"), gop_stream(3, 30.0, 6)) == [
        False,
        True,
        True,
        False,
        True,
        True,  # fmt: skip
    ]
    gate = DecodeGate("auto", max_fps=2.0)
    gate_decisions(gate, gop_stream(10, 30.0, 30))  # 1/3 s GOP: key frames only
    assert gate.keyframes_only
    gate_decisions(gate, [(True, 1.0), (True, 3.0)])  # the camera's GOP is now 2 s
    assert not gate.keyframes_only


def ipbb_stream(gop: int, frames: int, fps: float = 30.0):
    """(key, at, reference) in decode order for an I P B B P B B ... stream: each P comes before
    the two B frames shown before it, and nothing refers to a B frame."""
    packets = []
    for start in range(0, frames, gop):
        packets.append((True, start / fps, True))
        for anchor in range(start + 3, min(start + gop, frames), 3):
            packets.append((False, anchor / fps, True))
            packets += [(False, (anchor - k) / fps, False) for k in (2, 1)]
    return packets


def simulated_decode(gate: DecodeGate, sampler: FrameSampler, packets, delay: int = 2):
    """Frames taken, and packets skipped: frames leave a :class:`SimulatedDecoder`'s reorder
    buffer ``delay`` packets late, in time order, as a decoder's output does."""
    buffered: list[float] = []
    taken, skipped = [], 0

    def output(frames: list[float]) -> None:
        taken.extend(at for at in frames if sampler.take(at))

    for key, at, reference in packets:
        if gate.skip(key=key, at=at, reference=lambda r=reference: r):
            skipped += 1
            continue
        buffered.append(at)
        buffered.sort()
        if len(buffered) > delay:
            output([buffered.pop(0)])
    output(buffered)
    return taken, skipped


@pytest.mark.parametrize("gop", [30, 45, 90])
@pytest.mark.parametrize("max_fps", [0.5, 1.0, 2.0, 5.0])
def test_needed_takes_the_frames_a_full_decode_takes_and_decodes_fewer(gop, max_fps):
    packets = ipbb_stream(gop, 900)
    results = {}
    for mode in ("all", "needed"):
        sampler = FrameSampler(max_fps=max_fps)
        gate = DecodeGate(mode, max_fps=max_fps, sampler=sampler)
        results[mode] = simulated_decode(gate, sampler, packets)
    (every, none_skipped), (needed, skipped) = results["all"], results["needed"]
    assert none_skipped == 0 and needed == every
    # two of each three frames are B frames: most come before a due time (skipped)
    assert skipped >= 0.4 * len(packets)


def test_needed_skips_the_rest_of_a_gop_once_the_next_frame_due_is_after_its_key_frame():
    # 1 frame every 2 s of a stream with a key frame every 3 s: after the frame at 2 s the next
    # is due at 4 s, so the GOP's frames from 2 s to 3 s are skipped, references included
    sampler = FrameSampler(max_fps=0.5)
    gate = DecodeGate("needed", max_fps=0.5, sampler=sampler)
    packets = ipbb_stream(90, 270)
    decisions = {}
    buffered: list[float] = []
    for key, at, reference in packets:
        decisions[at] = gate.skip(key=key, at=at, reference=lambda r=reference: r)
        if not decisions[at]:
            buffered.append(at)
            buffered.sort()
            while len(buffered) > 2:
                sampler.take(buffered.pop(0))
    references_skipped = [
        at for key, at, reference in packets if reference and not key and decisions[at]
    ]
    assert references_skipped  # the first GOP measured the interval, the second skips its tail
    assert all(4.0 <= at < 6.0 or 7.0 < at < 9.0 for at in references_skipped)


@pytest.mark.parametrize(
    ("taken", "tail_skipped"),
    [((0.0, 2.0, 4.0), True), ((0.0, 1.9, 3.9), False)],  # next due at 6 s, or at 5.9 s
)
def test_an_open_gops_leading_pictures_are_skipped_only_after_its_tail_was(taken, tail_skipped):
    """A leading picture (after a key frame in decode order, before it in time) refers to the
    GOP before: undecodable once that GOP's tail was skipped, decoded otherwise."""
    sampler = FrameSampler(max_fps=0.5)
    gate = DecodeGate("needed", max_fps=0.5, sampler=sampler)
    for key_at in (0.0, 3.0):  # a 3 s GOP measured
        gate.skip(key=True, at=key_at)
    for at in taken:
        sampler.take(at)
    assert gate.skip(key=False, at=4.5, reference=lambda: True) is tail_skipped
    assert not gate.skip(key=True, at=6.0)
    assert gate.skip(key=False, at=5.8, reference=lambda: True) is tail_skipped


def test_key_frames_only_skips_the_key_frames_before_the_next_one_due():
    """A key frame every second sampled every two: every other key frame is skipped too, and
    the frames taken are those of a full decode."""
    packets = [(key, at, True) for key, at in gop_stream(30, 30.0, 600)]
    results = {}
    for mode in ("all", "auto"):
        sampler = FrameSampler(max_fps=0.5)
        results[mode] = simulated_decode(
            DecodeGate(mode, max_fps=0.5, sampler=sampler), sampler, packets, delay=0
        )
    (every, _), (taken, skipped) = results["all"], results["auto"]
    assert taken == every == [float(t) for t in range(0, 20, 2)]
    # the first GOP decoded whole (it measures the interval), then only the key frames taken:
    # 2 s, 4 s ... 18 s
    assert skipped == 600 - 30 - 9
