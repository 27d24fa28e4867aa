"""Per-camera frame queues (``pipeline.batching.queues``): windows, priorities, fairness, bounds.

Pure logic with a simulated clock: every call gets ``now`` (and ``captured``) explicitly.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.batching import CameraRules, Dropped, FrameQueues, Queued
from pipeline.batching.queues import IDLE_CAMERA_S, RATE_REFRESH_S

ROOMY = 10_000  # max_waiting large enough that nothing overflows
DEFAULT_RULES = CameraRules()
LEVELS = {"vip": CameraRules(priority=0), "mid": CameraRules(priority=1)}
LEVELS |= {"low": CameraRules(priority=2), "low2": CameraRules(priority=2)}


def make_queues(
    *,
    max_waiting: int = ROOMY,
    rules: dict[str, CameraRules] | None = None,
    default_rules: CameraRules = DEFAULT_RULES,
) -> FrameQueues[str]:
    return FrameQueues(max_waiting=max_waiting, default_rules=default_rules, rules=rules)


def feed(queues: FrameQueues[str], arrivals: list[tuple[str, float]]) -> list[Dropped[str]]:
    """Add frames named ``<camera><n>`` (n counting per camera from 0), captured = arrived."""
    counts: Counter[str] = Counter()
    dropped: list[Dropped[str]] = []
    for camera, now in arrivals:
        n = counts[camera]
        dropped += queues.add(camera, n, now, f"{camera}{n}", now)
        counts[camera] += 1
    return dropped


def items(batch: list[Queued[str]]) -> list[str]:
    return [q.item for q in batch]


def drained(queues: FrameQueues[str], count: int) -> list[list[str]]:
    batches = []
    while queues.waiting:
        batches.append(items(queues.take(count)))
    return batches


@pytest.mark.parametrize("max_waiting", [0, -1])
def test_invalid_queue_bound_raises(max_waiting: int) -> None:
    with pytest.raises(ValueError, match="max_waiting"):
        FrameQueues(max_waiting=max_waiting)


# --- windows ------------------------------------------------------------------------------

TWO_FRAMES = CameraRules(max_wait_frames=2, max_wait_ms=100)


@pytest.mark.parametrize(
    ("rules", "captures", "window_s"),
    [
        # measured from captured timestamps: 5 fps -> 2 frames = 400 ms, capped by max_wait_ms
        (TWO_FRAMES, [0.0, 0.2], 0.1),
        (CameraRules(max_wait_frames=2, max_wait_ms=1000), [0.0, 0.2], 0.4),
        (TWO_FRAMES, [0.0, 1 / 30], 2 / 30),  # 30 fps: 66.7 ms, under the cap
        # the fps prior until a second capture measures the real interval
        (CameraRules(max_wait_frames=2, max_wait_ms=100, fps=30), [0.0], 2 / 30),
        (CameraRules(max_wait_frames=2, max_wait_ms=100, fps=5), [0.0], 0.1),
        (CameraRules(max_wait_frames=2, max_wait_ms=100, fps=5), [0.0, 1 / 30], 2 / 30),
        (TWO_FRAMES, [0.0], 0.1),  # no prior and nothing measured: the cap
        (TWO_FRAMES, [1.0, 1.0], 0.1),  # equal captures measure nothing
        # max_wait_frames None: max_wait_ms alone, whatever the rate
        (CameraRules(max_wait_frames=None, max_wait_ms=100, fps=30), [0.0, 1 / 30], 0.1),
        (CameraRules(max_wait_frames=None, max_wait_ms=0), [0.0], 0.0),
        # the interval is smoothed: 0.1, then 0.1 + 0.1 * (0.05 - 0.1) = 0.095
        (CameraRules(max_wait_frames=2, max_wait_ms=1000), [0.0, 0.1, 0.15], 0.19),
        (CameraRules(max_wait_frames=0.5, max_wait_ms=1000), [0.0, 0.1], 0.05),
    ],
)
def test_window_is_frame_intervals_capped_by_max_wait(
    rules: CameraRules, captures: list[float], window_s: float
) -> None:
    queues = make_queues(default_rules=rules)
    for n, captured in enumerate(captures):
        queues.add("a", n, captured, f"a{n}", 10.0 + n)
    last = queues.take(len(captures))[-1]
    assert last.dispatch_by - last.arrived == pytest.approx(window_s)


@pytest.mark.parametrize(
    ("camera", "fps", "window_s"), [("slow", 5.0, 0.1), ("fast", 30.0, 2 / 30)]
)
def test_each_camera_gets_its_own_window(camera: str, fps: float, window_s: float) -> None:
    queues = make_queues(default_rules=TWO_FRAMES)
    for n in range(3):
        queues.add("slow", n, n / 5, f"slow{n}", 1.0)
        queues.add("fast", n, n / 30, f"fast{n}", 1.0)
    assert queues.camera(camera).fps == pytest.approx(fps)
    windows = {q.camera: q.dispatch_by - q.arrived for q in queues.take(6)}
    assert windows[camera] == pytest.approx(window_s)


@pytest.mark.parametrize(
    ("now", "due"), [(1.0, 0), (1.0999, 0), (1.1, 1), (1.15, 1), (1.25, 2), (1.5999, 2), (1.6, 3)]
)
def test_due_counts_frames_whose_window_closed(now: float, due: int) -> None:
    queues = make_queues(default_rules=CameraRules(max_wait_frames=None, max_wait_ms=100))
    feed(queues, [("a", 1.0), ("b", 1.1), ("a", 1.5)])
    assert queues.due(now) == due
    assert queues.any_due(now) is (due > 0)
    assert queues.earliest_dispatch_by() == pytest.approx(1.1)
    assert queues.oldest_arrival() == 1.0


def test_earliest_dispatch_by_sees_a_later_frame_with_a_shorter_window() -> None:
    queues = make_queues(default_rules=CameraRules(max_wait_frames=2, max_wait_ms=50))
    queues.add("a", 0, 0.0, "a0", 0.0)  # fps unknown: window 50 ms, due at 0.05
    queues.add("a", 1, 0.01, "a1", 0.01)  # 100 fps measured: window 20 ms, due at 0.03
    assert queues.due(0.035) == 1
    assert queues.earliest_dispatch_by() == pytest.approx(0.03)


# --- priority levels and fairness ---------------------------------------------------------


@pytest.mark.parametrize(
    ("arrivals", "count", "expected"),
    [
        # level 0 (vip, and unconfigured cameras) first, whatever the arrival order
        ([("low", 0.0), ("vip", 1.0)], 1, ["vip0"]),
        ([("low", 0.0), ("mid", 0.1), ("vip", 1.0)], 3, ["vip0", "mid0", "low0"]),
        ([("low", 0.0), ("low", 0.1), ("vip", 1.0), ("cam", 1.0)], 3, ["vip0", "cam0", "low0"]),
        # lower levels only fill what the higher ones leave
        ([("low", 0.0), ("vip", 1.0), ("vip", 1.1), ("vip", 1.2)], 3, ["vip0", "vip1", "vip2"]),
        ([("mid", 0.0), ("mid", 0.1), ("low", 0.2)], 2, ["mid0", "mid1"]),
        # round-robin within a level, not across levels
        ([("low", 0.0), ("low2", 0.0), ("mid", 0.5)], 3, ["mid0", "low0", "low20"]),
    ],
)
def test_priority_levels_are_served_in_order(
    arrivals: list[tuple[str, float]], count: int, expected: list[str]
) -> None:
    queues = make_queues(rules=LEVELS)
    feed(queues, arrivals)
    assert items(queues.take(count)) == expected


@pytest.mark.parametrize(
    ("arrivals", "count", "expected_batches"),
    [
        # a hot camera with 20 frames and three with one each, batch of 4: one each
        (
            [("hot", i * 0.01) for i in range(20)] + [("b", 1.0), ("c", 1.1), ("d", 1.2)],
            4,
            [["hot0", "b0", "c0", "d0"], ["hot1", "hot2", "hot3", "hot4"]],
        ),
        (  # ... whatever the arrival order
            [("b", 0.0), ("c", 0.0), ("d", 0.0)] + [("hot", 0.5)] * 20,
            4,
            [["b0", "c0", "d0", "hot0"], ["hot1", "hot2", "hot3", "hot4"]],
        ),
        # the hot camera only fills the slots the others leave empty
        ([("hot", 0.0)] * 5 + [("b", 0.1)], 4, [["hot0", "b0", "hot1", "hot2"], ["hot3", "hot4"]]),
        # a camera with nothing waiting is simply left out: no lockstep, no placeholder
        ([("a", 0.0), ("c", 0.1)], 4, [["a0", "c0"]]),
        # more cameras than slots: those left out go first next time
        (
            [("a", 0.1), ("b", 0.2), ("c", 0.3), ("d", 0.4), ("e", 0.5), ("a", 0.6), ("b", 0.7)],
            2,
            [["a0", "b0"], ["c0", "d0"], ["e0", "a1"], ["b1"]],
        ),
        # rounds within one batch: each camera in its own order
        ([("a", 0.0)] * 3 + [("b", 0.3)] * 2, 5, [["a0", "b0", "a1", "b1", "a2"]]),
    ],
)
def test_round_robin_gives_each_camera_its_share(
    arrivals: list[tuple[str, float]], count: int, expected_batches: list[list[str]]
) -> None:
    queues = make_queues()
    feed(queues, arrivals)
    for expected in expected_batches:
        assert items(queues.take(count)) == expected


@pytest.mark.parametrize(
    ("cameras", "count", "batches"), [(5, 2, 10), (5, 3, 10), (7, 4, 7), (3, 1, 9), (4, 4, 3)]
)
def test_the_camera_served_last_goes_to_the_back_so_none_starves(
    cameras: int, count: int, batches: int
) -> None:
    names = [f"cam{i}" for i in range(cameras)]
    queues = make_queues()
    feed(queues, [(name, 0.0) for _ in range(batches * count) for name in names])
    served: Counter[str] = Counter()
    for _ in range(batches):
        batch = queues.take(count)
        assert len({q.camera for q in batch}) == len(batch)  # one each while all have frames
        served.update(q.camera for q in batch)
    # every camera waits at most one lap: shares differ by at most one frame
    assert set(served) == set(names)
    assert max(served.values()) - min(served.values()) <= 1
    assert sum(served.values()) == batches * count


def test_rotation_order_over_many_batches() -> None:
    queues = make_queues()
    feed(queues, [(camera, 0.0) for _ in range(4) for camera in "abcde"])
    firsts = [[q.camera for q in queues.take(2)] for _ in range(5)]
    assert firsts == [["a", "b"], ["c", "d"], ["e", "a"], ["b", "c"], ["d", "e"]]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 100])
def test_each_camera_leaves_in_arrival_order(count: int) -> None:
    queues = make_queues(rules=LEVELS)
    cameras = ["vip", "low", "cam", "mid"]
    feed(queues, [(cameras[(i * 7) % 4], i * 0.001) for i in range(40)])  # 10 frames each
    seen: dict[str, list[int]] = {camera: [] for camera in cameras}
    while queues.waiting:
        batch = queues.take(count)
        assert 1 <= len(batch) <= count
        for q in batch:
            seen[q.camera].append(q.seq)
    assert seen == {camera: list(range(10)) for camera in cameras}


def test_queued_records_camera_seq_and_times() -> None:
    queues = make_queues(rules={"cam-1": CameraRules(max_frame_age_ms=300, max_wait_ms=40)})
    queues.add("cam-1", 41, 12.0, "x", 12.5)
    (queued,) = queues.take(1)
    assert (queued.camera, queued.seq, queued.captured, queued.arrived, queued.item) == (
        "cam-1",
        41,
        12.0,
        12.5,
        "x",
    )
    assert queued.expires == pytest.approx(12.3)  # from capture, not arrival
    assert queued.dispatch_by == pytest.approx(12.54)


# --- freshness ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "service_s", "stale"),
    [
        (0.05, 0.0, []),
        (0.1, 0.0, []),  # finishing exactly at the deadline is still in time
        (0.11, 0.0, ["live0"]),
        (0.05, 0.05, []),
        (0.05, 0.06, ["live0"]),  # in time now, but the batch could not finish in time
        (0.15, 0.06, ["live0", "live1"]),
        (0.2, 0.0, ["live0"]),  # live1 exactly at its deadline stays, while live0 goes
        (0.25, 0.0, ["live0", "live1"]),
        (5.0, 9.0, ["live0", "live1"]),  # the camera without a deadline never goes stale
    ],
)
def test_frames_that_cannot_finish_fresh_are_dropped_as_stale(
    now: float, service_s: float, stale: list[str]
) -> None:
    queues = make_queues(rules={"live": CameraRules(max_frame_age_ms=100)})
    queues.add("live", 0, 0.0, "live0", 0.02)  # expires at 0.1 (from capture)
    queues.add("live", 1, 0.1, "live1", 0.1)  # expires at 0.2
    queues.add("file", 0, 0.0, "file0", 0.0)  # no freshness deadline
    dropped = queues.expire(now, service_s)
    assert [d.frame.item for d in dropped] == stale
    assert {d.cause for d in dropped} <= {"stale"}
    assert queues.waiting == 3 - len(stale)
    assert queues.expire(now, service_s) == []  # dropped once


@pytest.mark.parametrize(
    ("arrivals", "superseded", "left"),
    [
        ([("snap", 0.0)], [], ["snap0"]),
        ([("snap", 0.0), ("snap", 1.0), ("snap", 2.0)], ["snap0", "snap1"], ["snap2"]),
        # other cameras keep their queues
        ([("snap", 0.0), ("a", 0.1), ("a", 0.2), ("snap", 0.3)], ["snap0"], ["snap1", "a0", "a1"]),
        ([("a", 0.0), ("a", 0.1)], [], ["a0", "a1"]),
    ],
)
def test_keep_latest_supersedes_older_frames(
    arrivals: list[tuple[str, float]], superseded: list[str], left: list[str]
) -> None:
    queues = make_queues(rules={"snap": CameraRules(keep_latest=True)})
    dropped = feed(queues, arrivals)
    assert [(d.frame.item, d.cause) for d in dropped] == [(s, "superseded") for s in superseded]
    assert queues.waiting == len(left)
    assert items(queues.take(10)) == left


# --- bounds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arrivals", "max_waiting", "evicted"),
    [
        ([("a", 0.0)] * 3, 3, []),
        ([("a", 0.0)] * 4, 3, ["a0"]),  # the oldest frame goes
        ([("a", 0.0)] * 6, 3, ["a0", "a1", "a2"]),
        # the longest queue loses its oldest frame
        ([("a", 0.0), ("b", 0.1), ("b", 0.2), ("b", 0.3)], 3, ["b0"]),
        ([("a", 0.0), ("a", 0.1), ("b", 0.2), ("c", 0.3), ("d", 0.4)], 4, ["a0"]),
        # the least important level loses first, even when its queue is shorter
        ([("vip", 0.0), ("vip", 0.1), ("low", 0.2), ("vip", 0.3)], 3, ["low0"]),
        ([("mid", 0.0), ("low", 0.1), ("vip", 0.2), ("vip", 0.3)], 3, ["low0"]),
        ([("vip", 0.0), ("mid", 0.1), ("mid", 0.2), ("vip", 0.3)], 3, ["mid0"]),
        # a frame of the lowest level is dropped on arrival when nothing lower waits
        ([("vip", 0.0), ("vip", 0.1), ("low", 0.2)], 2, ["low0"]),
        # within the lowest level, its longest queue
        ([("low", 0.0), ("low2", 0.1), ("low2", 0.2), ("vip", 0.3)], 3, ["low20"]),
    ],
)
def test_overflow_evicts_the_oldest_of_the_longest_queue_in_the_lowest_level(
    arrivals: list[tuple[str, float]], max_waiting: int, evicted: list[str]
) -> None:
    queues = make_queues(max_waiting=max_waiting, rules=LEVELS)
    dropped = feed(queues, arrivals)
    assert [d.frame.item for d in dropped] == evicted
    assert {d.cause for d in dropped} <= {"overflow"}
    assert queues.waiting == len(arrivals) - len(evicted) <= max_waiting


# --- arrival rate and idle cameras --------------------------------------------------------


@pytest.mark.parametrize(
    ("heard", "now", "rate"),
    [
        ([], 0.0, 0.0),
        ([("a", 10.0, 0.0)], 0.0, 10.0),  # measured from two captures 0.1 apart
        ([("a", 10.0, 0.0), ("b", 25.0, 0.0)], 0.0, 35.0),
        ([("a", 10.0, 0.0), ("b", 25.0, 0.0)], IDLE_CAMERA_S, 35.0),  # just heard enough
        ([("a", 10.0, 0.0), ("b", 25.0, 1.0)], IDLE_CAMERA_S + 0.5, 25.0),  # a went quiet
        ([("a", 10.0, 0.0), ("b", 25.0, 1.0)], 9.0, 0.0),
    ],
)
def test_arrival_rate_counts_only_recently_heard_cameras(
    heard: list[tuple[str, float, float]], now: float, rate: float
) -> None:
    queues = make_queues()
    for camera, fps, last_arrival in heard:
        queues.add(camera, 0, 0.0, f"{camera}0", last_arrival - 0.01)
        queues.add(camera, 1, 1 / fps, f"{camera}1", last_arrival)
    assert queues.arrival_rate(now) == pytest.approx(rate)


@pytest.mark.parametrize(
    ("later", "rate"),
    [
        (0.0, 0.0),
        (RATE_REFRESH_S / 2, 0.0),  # the sum is kept for a while ...
        (RATE_REFRESH_S, 10.0),  # ... and recomputed after RATE_REFRESH_S
        (-0.5, 10.0),  # a clock that went back recomputes too
    ],
)
def test_arrival_rate_is_recomputed_at_most_every_refresh_interval(
    later: float, rate: float
) -> None:
    queues = make_queues()
    assert queues.arrival_rate(1.0) == 0.0
    queues.add("a", 0, 0.0, "a0", 1.0)
    queues.add("a", 1, 0.1, "a1", 1.0)  # 10 fps
    assert queues.arrival_rate(1.0 + later) == pytest.approx(rate)


def test_arrival_rate_uses_the_fps_prior_until_measured() -> None:
    queues = make_queues(rules={"a": CameraRules(fps=12), "b": CameraRules(fps=12)})
    queues.add("a", 0, 0.0, "a0", 0.0)
    queues.add("b", 0, 0.0, "b0", 0.0)
    queues.add("b", 1, 0.2, "b1", 0.2)  # measured 5 fps replaces b's prior
    queues.camera("never-heard")  # a known camera that sent nothing counts for nothing
    assert queues.arrival_rate(0.5) == pytest.approx(17.0)


@pytest.mark.parametrize(
    ("queued", "now", "idle_s", "forgotten"),
    [
        (False, 30.0, 60.0, False),  # silent for 30 s only
        (False, 61.0, 60.0, True),
        (False, 61.0, 120.0, False),
        (False, 5.0, 1.0, True),
        (True, 500.0, 60.0, False),  # a frame still waits: keep the camera
    ],
)
def test_forget_idle_lets_go_of_silent_empty_cameras(
    queued: bool, now: float, idle_s: float, forgotten: bool
) -> None:
    queues = make_queues()
    queues.add("a", 0, 0.0, "a0", 0.0)
    queues.add("a", 1, 0.01, "a1", 0.0)  # measured 100 fps
    queues.add("b", 0, 0.0, "b0", now)  # heard just now: never forgotten
    queues.take(3)
    if queued:
        queues.add("a", 2, 0.02, "a2", 0.0)
    queues.forget_idle(now, idle_s)
    # a forgotten camera starts afresh: its measured rate is gone
    assert queues.camera("a").fps == (None if forgotten else pytest.approx(100.0))
    assert queues.camera("b").fps is None  # one capture: nothing measured, no prior
    assert queues.waiting == int(queued)


def test_a_forgotten_camera_that_returns_is_served_again() -> None:
    queues = make_queues()
    feed(queues, [("a", 0.0), ("b", 0.0)])
    queues.take(2)
    queues.forget_idle(100.0)
    queues.add("a", 5, 100.0, "a5", 100.0)
    queues.add("c", 0, 100.0, "c0", 100.0)
    assert items(queues.take(2)) == ["a5", "c0"]
    assert queues.waiting == 0


# --- properties ---------------------------------------------------------------------------

CAMERAS = ("a", "b", "c")

queue_operations = st.lists(
    st.one_of(
        # (what, camera, count or service seconds, clock step)
        st.tuples(st.just("add"), st.sampled_from(CAMERAS), st.just(0.0), st.floats(0, 0.05)),
        st.tuples(st.just("take"), st.just(""), st.integers(1, 5).map(float), st.floats(0, 0.05)),
        st.tuples(st.just("expire"), st.just(""), st.floats(0, 0.1), st.floats(0, 0.05)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    max_waiting=st.integers(1, 12),
    rules=st.fixed_dictionaries(
        {
            camera: st.builds(
                CameraRules,
                priority=st.integers(0, 1),
                max_wait_frames=st.none() | st.floats(0.5, 3),
                max_wait_ms=st.floats(0, 100),
                max_frame_age_ms=st.none() | st.floats(1, 200),
                keep_latest=st.booleans(),
            )
            for camera in CAMERAS
        }
    ),
    ops=queue_operations,
)
def test_cached_minimums_match_the_frames_waiting(
    max_waiting: int, rules: dict[str, CameraRules], ops: list[tuple[str, str, float, float]]
) -> None:
    queues = make_queues(max_waiting=max_waiting, rules=rules)
    now, seqs = 0.0, Counter[str]()
    for kind, camera, number, step in ops:
        now += step
        if kind == "add":
            queues.add(camera, seqs[camera], now - 0.01, f"{camera}{seqs[camera]}", now)
            seqs[camera] += 1
        elif kind == "take":
            assert len(queues.take(int(number))) <= number
        else:
            queues.expire(now, number)
        frames = [q for camera in CAMERAS for q in queues.camera(camera).queue]
        assert queues.waiting == len(frames) <= max_waiting
        assert queues.oldest_arrival() == min((q.arrived for q in frames), default=None)
        earliest = min((q.dispatch_by for q in frames), default=None)
        assert queues.earliest_dispatch_by() == earliest
        assert queues.due(now) == sum(q.dispatch_by <= now for q in frames)
        assert queues.any_due(now) is (earliest is not None and earliest <= now)


def test_a_priority_changed_while_running_applies_to_the_next_batch() -> None:
    queues = make_queues()
    feed(queues, [("a", 0.0), ("b", 0.1), ("a", 0.2), ("b", 0.3)])
    queues.set_rules("b", CameraRules(priority=0, max_wait_ms=DEFAULT_RULES.max_wait_ms))
    queues.set_rules("a", CameraRules(priority=5, max_wait_ms=DEFAULT_RULES.max_wait_ms))
    assert items(queues.take(2)) == ["b0", "b1"]  # a waits behind b now
    queues.set_rules("new", CameraRules(priority=1))  # added live: rules before its first frame
    feed(queues, [("new", 0.4)])
    assert items(queues.take(2)) == ["new0", "a0"]


def test_cameras_added_while_running_make_room_to_be_read() -> None:
    queues = make_queues(max_waiting=8)
    queues.make_room(cameras=3)
    assert queues.max_waiting == 8  # room enough already
    queues.make_room(cameras=16)  # 16 streams: a read of one frame each must fit, twice over
    assert queues.max_waiting == 32
