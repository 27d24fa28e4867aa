"""When a reader on a Redis Cluster asks each of its streams (``StreamPolls``): a stream whose
entries come steadily is asked often only around when the next is due, and one that gives
nothing otherwise after waits that grow with the time it has been quiet, so a camera sampled
at 0.5 fps is not asked 400 times between two frames and its frames are still read soon."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable

import pytest

from streams.redis_cluster import CLUSTER_POLL_S, IDLE_POLL_MAX_S, StreamPolls


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def entry(ms: int) -> tuple[bytes, dict]:
    return (f"{ms}-0".encode(), {b"seq": b"0"})


def run(
    polls: StreamPolls,
    clock: FakeClock,
    arrivals_ms: list[int],
    until_ms: int,
    busy: Callable[[int], bool] = lambda step: False,
) -> list:
    """Ask stream "s" whenever due, 1 ms a step, frames arriving at ``arrivals_ms`` (ms after
    the clock's start), the reader ``busy`` at some steps (asking nothing): how many asks, and
    each frame's wait between arriving and being read."""
    start, asks, waits, pending = clock.now, 0, [], list(arrivals_ms)
    for step in range(until_ms):
        clock.now = start + step / 1000
        if busy(step) or polls.due({"s": ">"}) != ["s"]:
            continue
        asks += 1
        came = [ms for ms in pending if ms <= step]
        pending = pending[len(came) :]
        waits += [step - ms for ms in came]
        polls.answered("s", [entry(int(start * 1000) + ms) for ms in came], new=True)
    return [asks, waits]


def test_a_stream_that_gave_entries_is_asked_again_at_once():
    clock = FakeClock()
    polls = StreamPolls(clock)
    polls.answered("s", [entry(1)], new=True)
    assert polls.due({"s": ">"}) == ["s"]


def test_a_stream_with_no_steady_interval_waits_longer_the_longer_it_is_quiet():
    clock = FakeClock()
    polls = StreamPolls(clock)
    waits, quiet = [], []
    for _ in range(80):
        polls.answered("s", [], new=True)
        waits.append(polls.next_due({"s": ">"}) - clock.now)
        quiet.append(clock.now - 100.0)
        clock.now = polls.next_due({"s": ">"})
    assert waits[0] == pytest.approx(CLUSTER_POLL_S)
    # never more than an eighth of how long it had been quiet (then: the reads' lateness)
    assert all(w <= max(CLUSTER_POLL_S, q / 8) + 1e-9 for w, q in zip(waits, quiet, strict=True))
    assert waits == sorted(waits) and waits[-1] == pytest.approx(IDLE_POLL_MAX_S)


def test_a_30_fps_camera_is_asked_as_often_as_before():
    clock = FakeClock()
    polls = StreamPolls(clock)
    arrivals = list(range(0, 2_000, 33))
    asks, waits = run(polls, clock, arrivals, 2_000)
    assert len(waits) == len(arrivals)
    assert max(waits) <= CLUSTER_POLL_S * 1000


def test_a_camera_at_half_a_frame_a_second_is_asked_a_few_times_a_frame_not_hundreds():
    """Asked every 5 ms, 400 times between two frames; now around when the next is due."""
    clock = FakeClock()
    polls = StreamPolls(clock)
    arrivals = list(range(0, 40_000, 2_000))
    asks, waits = run(polls, clock, arrivals, 40_000)
    assert len(waits) == len(arrivals)
    assert asks / len(arrivals) < 20
    # once its interval is known (three frames), read within a poll of its arrival
    assert max(waits[3:]) <= CLUSTER_POLL_S * 1000


def test_a_camera_whose_frames_come_unevenly_is_still_read_soon():
    clock = FakeClock()
    polls = StreamPolls(clock)
    rng = random.Random(7)
    arrivals = [n * 2_000 + rng.randint(-60, 60) for n in range(1, 20)]
    asks, waits = run(polls, clock, arrivals, 40_000)
    assert len(waits) == len(arrivals)
    assert asks / len(arrivals) < 40
    assert statistics.median(waits) <= 2 * CLUSTER_POLL_S * 1000
    assert max(waits) <= 250  # never more than an eighth of its interval


def test_a_frame_that_comes_late_waits_at_most_an_eighth_of_its_lateness_more():
    clock = FakeClock()
    polls = StreamPolls(clock)
    arrivals = list(range(0, 20_000, 2_000))
    arrivals[6] += 400  # a decode host's tick stalled
    asks, waits = run(polls, clock, arrivals, 20_000)
    assert waits[6] <= 400 / 8 + CLUSTER_POLL_S * 1000


def test_a_reader_busy_at_first_reads_on_time_within_a_few_frames():
    """The first frames read late (a worker starved at start): the lead of its clock over the
    server's is learnt too large, so the next frames were thought due late; it is corrected
    by each read, and a frame never waits for it more than a quarter second."""
    clock = FakeClock()
    polls = StreamPolls(clock)
    arrivals = list(range(0, 40_000, 2_000))
    late = [(ms, ms + 1_500) for ms in arrivals[:4]]  # each of the first four read 1.5 s late
    asks, waits = run(
        polls, clock, arrivals, 40_000, busy=lambda t: any(a <= t < b for a, b in late)
    )
    assert len(waits) == len(arrivals)
    assert max(waits[4:]) <= 250
    assert max(waits[8:]) <= CLUSTER_POLL_S * 1000


def test_a_stream_read_from_its_own_pending_entries_is_always_asked():
    clock = FakeClock()
    polls = StreamPolls(clock)
    polls.answered("s", [], new=False)
    polls.answered("s", [], new=False)
    assert polls.due({"s": "0"}) == ["s"]
    assert polls.due({"s": ">"}) == []


def test_a_stream_that_went_quiet_is_asked_at_most_every_quarter_second():
    clock = FakeClock()
    polls = StreamPolls(clock)
    for _ in range(200):
        polls.answered("s", [], new=True)
        clock.now = polls.next_due({"s": ">"})
    polls.answered("s", [], new=True)
    assert polls.next_due({"s": ">"}) - clock.now == pytest.approx(IDLE_POLL_MAX_S)


def test_streams_no_longer_read_leave_the_schedule():
    clock = FakeClock()
    polls = StreamPolls(clock)
    polls.answered("a", [], new=True)
    polls.answered("b", [], new=True)
    polls.forget({"b": ">"})
    assert len(polls) == 1


def test_a_stream_read_without_a_group_from_an_id_waits_like_any_other():
    """XREAD (a consumer of detections) reads from the last id it had: no pending entries."""
    clock = FakeClock()
    polls = StreamPolls(clock)
    polls.answered("s", [], new=True)
    assert polls.due({"s": "12-0"}, group=False) == []
    clock.now += CLUSTER_POLL_S
    assert polls.due({"s": "12-0"}, group=False) == ["s"]
