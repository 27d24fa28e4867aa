"""Frame accounting and the run summary, driven by hand with a fake clock."""

from __future__ import annotations

import pytest

from pipeline.ledger.accounting import Accounting
from pipeline.ledger.summary import percentile
from streams.messages import CameraPosition


class FakeClock:
    """A clock that returns whatever time the test set."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def camera_summary(accounting: Accounting, camera: str):
    (summary,) = [c for c in accounting.summary().cameras if c.camera == camera]
    return summary


# --- percentile ---------------------------------------------------------------------------

ONE_TO_TEN = [float(v) for v in range(1, 11)]
ONE_TO_HUNDRED = [float(v) for v in range(1, 101)]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([], 99, None),
        ([4.0], 0, 4.0),
        ([4.0], 50, 4.0),
        ([4.0], 100, 4.0),
        (ONE_TO_TEN, 0, 1.0),  # rank never below 1
        (ONE_TO_TEN, 10, 1.0),
        (ONE_TO_TEN, 11, 2.0),  # nearest rank rounds up, no interpolation
        (ONE_TO_TEN, 50, 5.0),
        (ONE_TO_TEN, 51, 6.0),
        (ONE_TO_TEN, 90, 9.0),
        (ONE_TO_TEN, 99, 10.0),
        (ONE_TO_TEN, 100, 10.0),
        ([1.0, 2.0], 50, 1.0),
        ([1.0, 2.0, 3.0], 50, 2.0),
        (ONE_TO_HUNDRED, 50, 50.0),
        (ONE_TO_HUNDRED, 90, 90.0),
        (ONE_TO_HUNDRED, 99, 99.0),
        ([0.01, 0.02, 0.5, 0.7, 9.0], 99, 9.0),
        ([0.01, 0.02, 0.5, 0.7, 9.0], 50, 0.5),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected


@pytest.mark.parametrize("q", [50, 90, 99])
@pytest.mark.parametrize("count", [1, 2, 3, 7, 10, 99, 100, 101, 1000, 12345])
def test_percentile_used_by_the_summary_has_the_exact_nearest_rank(q: int, count: int) -> None:
    values = list(range(1, count + 1))
    exact_rank = max(1, -(-q * count // 100))  # ceil(q * count / 100) in integers
    assert percentile(values, q) == exact_rank


# --- drops and sessions -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seqs", "overflow", "decoded"),
    [
        ([0, 1, 2, 3], 0, 4),
        ([0, 1, 5, 6], 3, 7),  # 2, 3, 4 trimmed from the capped stream
        ([3, 4], 3, 5),  # the first three were trimmed before the batcher read any
        ([0, 2, 4, 6], 3, 7),
        ([5, 5], 5, 6),  # the same non-zero seq again: a redelivery, neither drop nor restart
        # seq going back is a restarted decoder: a new session, not a drop, and counted on top
        ([0, 1, 2, 0, 1], 0, 3 + 2),
        ([0, 1, 2, 3, 4, 0, 3], 2, 5 + 4),  # a gap inside the new session is a drop
        ([0, 1, 2, 3, 4, 2, 3], 2, 5 + 4),  # back to a non-zero seq: its first two trimmed
        ([0, 0, 0], 0, 3),  # three one-frame sessions
    ],
)
def test_seq_gaps_become_overflow_drops_and_restarts_start_a_session(
    seqs: list[int], overflow: int, decoded: int
) -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    for seq in seqs:
        accounting.on_received("a", seq)
    summary = camera_summary(accounting, "a")
    assert summary.dropped.get("overflow", 0) == overflow
    assert summary.decoded == decoded


@pytest.mark.parametrize(
    ("seqs", "end_frames", "overflow", "decoded"),
    [
        ([0, 1, 2], 3, 0, 3),  # all seen
        ([0, 1, 2], 5, 2, 5),  # the last two were trimmed
        ([], 4, 4, 4),  # nothing seen at all
        ([], 0, 0, 0),  # an empty source
        ([0, 1, 4], 6, 2 + 1, 6),  # a gap and a trimmed tail
        ([0, 1, 2, 3, 0, 1], 2, 0, 4 + 2),  # end of the second session, all of it seen
        ([0, 1, 2, 3, 0, 1], 5, 3, 4 + 5),  # ... with its tail trimmed
        # the daemon writes frames=-1 for a decoder that died without its own end entry
        ([0, 1, 2], -1, 0, 3),
    ],
)
def test_end_marker_with_more_frames_than_seen_adds_overflow(
    seqs: list[int], end_frames: int, overflow: int, decoded: int
) -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    for seq in seqs:
        accounting.on_received("a", seq)
    accounting.on_end("a", end_frames, "eof", "", 0)
    summary = camera_summary(accounting, "a")
    assert summary.dropped.get("overflow", 0) == overflow
    assert summary.decoded == decoded
    assert summary.end_reason == "eof"


def test_a_session_after_an_end_marker_is_counted_on_top() -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    for seq in range(3):
        accounting.on_received("a", seq)
    accounting.on_end("a", 3, "crashed", "decoder process for camera 'a' died", 0)
    for seq in range(2):
        accounting.on_received("a", seq)
    accounting.on_end("a", 4, "eof", "", 0)
    summary = camera_summary(accounting, "a")
    assert summary.decoded == 3 + 4
    assert summary.dropped == {"overflow": 2}
    assert summary.end_reason == "eof"


@pytest.mark.parametrize("restart", [[0, 1], [0], [1, 2]])
def test_processed_never_exceeds_decoded_across_restarts(restart: list[int]) -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    seqs = [0, 1, 2, 3, *restart]
    for seq in seqs:
        accounting.on_received("a", seq)
    accounting.on_published([("a", 0.01, 0.001)] * len(seqs), published=1.0)
    summary = camera_summary(accounting, "a")
    assert summary.processed == len(seqs)
    assert summary.decoded == summary.processed + sum(summary.dropped.values())


@pytest.mark.parametrize(("decode_errors", "expected"), [(0, None), (1, 1), (17, 17)])
def test_decode_errors_are_counted_as_drops(decode_errors: int, expected: int | None) -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    accounting.on_received("a", 0)
    accounting.on_end("a", 1, "error", "camera 'a': bad data", decode_errors)
    summary = camera_summary(accounting, "a")
    assert summary.dropped.get("decode_error") == expected
    assert (summary.end_reason, summary.error) == ("error", "camera 'a': bad data")


@pytest.mark.parametrize(
    ("shed", "dropped", "outstanding"),
    [
        ([], {}, 4),
        (["stale"], {"stale": 1}, 3),
        (["stale", "stale", "stale"], {"stale": 3}, 1),
        (
            ["stale", "superseded", "overflow", "stale"],
            {"stale": 2, "superseded": 1, "overflow": 1},
            0,
        ),
    ],
)
def test_shed_frames_count_one_by_one_by_cause_and_as_done(
    shed: list[str], dropped: dict[str, int], outstanding: int
) -> None:
    accounting = Accounting(["a", "b"], clock=FakeClock())
    for seq in range(4):
        accounting.on_received("a", seq)
    accounting.on_received("b", 0)
    for cause in shed:
        accounting.on_shed("a", cause)
    assert accounting.outstanding("a") == outstanding
    assert accounting.outstanding("b") == 1  # the other camera is untouched
    accounting.on_end("a", 4, "eof", "", 0)
    accounting.on_end("b", 1, "eof", "", 0)
    accounting.on_published([("b", 0.1, 0.01)], published=1.0)
    assert accounting.all_done() is (outstanding == 0)
    if outstanding:
        accounting.on_published([("a", 0.1, 0.01)] * outstanding, published=2.0)
    assert accounting.outstanding("a") == 0
    assert accounting.all_done()
    summary = camera_summary(accounting, "a")
    assert summary.dropped == dropped
    assert (summary.decoded, summary.processed) == (4, 4 - len(shed))


# --- ended / all_ended / all_done ---------------------------------------------------------


@pytest.mark.parametrize(
    ("cameras", "ended", "query", "expected"),
    [
        (["a", "b"], [], ["a"], False),
        (["a", "b"], ["a"], ["a"], True),
        (["a", "b"], ["a"], ["a", "b"], False),
        (["a", "b"], ["a", "b"], ["a", "b"], True),
        (["a", "b"], ["b"], [], True),  # nothing asked: vacuously true
        (["a"], ["a"], ["unknown"], False),  # a camera never heard of has not ended
    ],
)
def test_ended(cameras: list[str], ended: list[str], query: list[str], expected: bool) -> None:
    accounting = Accounting(cameras, clock=FakeClock())
    for camera in ended:
        accounting.on_end(camera, 0, "eof", "", 0)
    assert accounting.ended(query) is expected


@pytest.mark.parametrize(
    ("cameras", "ended", "all_ended"),
    [
        (["a", "b"], [], False),
        (["a", "b"], ["a"], False),
        (["a", "b"], ["b", "a"], True),
        ([], [], True),
        (["a"], ["a", "late"], True),  # a camera first seen by its end marker counts too
    ],
)
def test_all_ended(cameras: list[str], ended: list[str], all_ended: bool) -> None:
    accounting = Accounting(cameras, clock=FakeClock())
    for camera in ended:
        accounting.on_end(camera, 0, "eof", "", 0)
    assert accounting.all_ended() is all_ended


def test_a_frame_from_an_unconfigured_camera_must_end_too() -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    accounting.on_end("a", 0, "eof", "", 0)
    assert accounting.all_ended()
    accounting.on_received("extra", 0)
    assert not accounting.all_ended()
    assert not accounting.all_done()


@pytest.mark.parametrize(
    ("received", "published", "shed", "ended", "all_done"),
    [
        (3, 3, 0, True, True),
        (3, 2, 0, True, False),  # a frame still in flight
        (3, 2, 1, True, True),  # the last one shed by the policy after receipt
        (3, 3, 0, False, False),  # everything published but no end marker yet
        (0, 0, 0, True, True),
    ],
)
def test_all_done(received: int, published: int, shed: int, ended: bool, all_done: bool) -> None:
    accounting = Accounting(["a", "b"], clock=FakeClock())
    for seq in range(received):
        accounting.on_received("a", seq)
    if published:
        accounting.on_published([("a", 0.05, 0.01)] * published, published=2.0)
    for _ in range(shed):
        accounting.on_shed("a", "stale")
    accounting.on_end("b", 0, "eof", "", 0)
    if ended:
        accounting.on_end("a", received, "eof", "", 0)
    assert accounting.all_done() is all_done


# --- summary ------------------------------------------------------------------------------


def test_summary_figures_with_a_fake_clock() -> None:
    clock = FakeClock(1000.0)
    accounting = Accounting(["a", "b"], max_batch_size=4, clock=clock)
    for seq in range(5):
        accounting.on_received("a", seq)
    for seq in range(3):
        accounting.on_received("b", seq)
    accounting.on_published(
        [("a", 0.10, 0.01), ("a", 0.20, 0.02), ("b", 0.30, 0.03), ("b", 0.40, 0.04)],
        published=1001.0,
    )
    accounting.on_published([("a", 0.50, 0.05), ("b", 0.60, 0.06)], published=1002.0)
    accounting.on_published([("a", 0.70, 0.07), ("a", 0.80, 0.08)], published=1003.5)
    accounting.on_end("a", 5, "eof", "", 0)
    accounting.on_end("b", 4, "eof", "", 0)
    clock.now = 1010.0

    summary = accounting.summary()

    assert summary.batches == 3
    assert summary.batch_sizes == {2: 2, 4: 1}
    assert list(summary.batch_sizes) == [2, 4]  # sorted by size
    assert summary.mean_batch_size == pytest.approx(8 / 3)
    assert summary.batch_fill_ratio == pytest.approx(8 / 3 / 4)
    assert summary.wall_s == pytest.approx(10.0)
    assert summary.processing_s == pytest.approx(2.5)  # first to last published batch
    assert summary.processed == 8
    assert summary.throughput_fps == pytest.approx(0.8)
    assert summary.dropped == {"overflow": 1}
    # all latencies sorted: .1 .2 .3 .4 .5 .6 .7 .8 -> nearest rank 4, 8, 8
    assert summary.latency_p50_s == pytest.approx(0.4)
    assert summary.latency_p90_s == pytest.approx(0.8)
    assert summary.latency_p99_s == pytest.approx(0.8)
    assert summary.queue_delay_p50_s == pytest.approx(0.04)
    assert summary.queue_delay_p99_s == pytest.approx(0.08)
    a, b = summary.cameras
    assert (a.camera, a.decoded, a.processed, a.dropped) == ("a", 5, 5, {})
    assert (b.camera, b.decoded, b.processed, b.dropped) == ("b", 4, 3, {"overflow": 1})
    # a: .1 .2 .5 .7 .8; b: .3 .4 .6
    assert (a.latency_p50_s, a.latency_p99_s) == (pytest.approx(0.5), pytest.approx(0.8))
    assert (b.latency_p50_s, b.latency_p99_s) == (pytest.approx(0.4), pytest.approx(0.6))
    assert summary.to_json()["processed"] == 8
    text = summary.format()
    assert "batches 3, mean batch size 2.67 (fill 67%), sizes 2x2 4x1" in text
    assert "queue delay p50 40 ms, p99 80 ms" in text
    assert "camera b: decoded 4 = processed 3 + dropped overflow 1" in text


def test_summary_of_an_idle_run() -> None:
    clock = FakeClock(50.0)
    accounting = Accounting(["z", "a"], max_batch_size=8, clock=clock)
    clock.now = 53.0
    summary = accounting.summary()
    assert [c.camera for c in summary.cameras] == ["a", "z"]  # sorted by name
    assert summary.batches == 0
    assert summary.batch_sizes == {}
    assert summary.mean_batch_size == 0.0
    assert summary.batch_fill_ratio == 0.0
    assert summary.wall_s == pytest.approx(3.0)
    assert summary.processing_s == 0.0
    assert summary.throughput_fps == 0.0
    assert summary.latency_p50_s is None
    assert (summary.queue_delay_p50_s, summary.queue_delay_p99_s) == (None, None)
    assert summary.cameras[0].latency_p99_s is None
    assert "latency p50 -" in summary.format()
    assert "queue delay p50 -, p99 -" in summary.format()


@pytest.mark.parametrize(
    ("batch_sizes", "max_batch_size", "histogram", "mean", "fill"),
    [
        ([1], 1, {1: 1}, 1.0, 1.0),
        ([4, 4, 4], 4, {4: 3}, 4.0, 1.0),
        ([1, 2, 3, 4], 8, {1: 1, 2: 1, 3: 1, 4: 1}, 2.5, 2.5 / 8),
        ([8, 1, 8, 3], 8, {1: 1, 3: 1, 8: 2}, 5.0, 5 / 8),
        ([1, 1, 1, 1], 8, {1: 4}, 1.0, 1 / 8),  # batch1 traffic on a batch-8 engine
        ([], 16, {}, 0.0, 0.0),
    ],
)
def test_batch_size_histogram_mean_and_fill(
    batch_sizes: list[int],
    max_batch_size: int,
    histogram: dict[int, int],
    mean: float,
    fill: float,
) -> None:
    accounting = Accounting(["a"], max_batch_size=max_batch_size, clock=FakeClock())
    for i, size in enumerate(batch_sizes):
        accounting.on_published([("a", 0.01, 0.001)] * size, published=float(i))
    summary = accounting.summary()
    assert summary.batch_sizes == histogram
    assert list(summary.batch_sizes) == sorted(histogram)
    assert summary.mean_batch_size == pytest.approx(mean)
    assert summary.batch_fill_ratio == pytest.approx(fill)
    assert summary.processed == sum(batch_sizes)


@pytest.mark.parametrize(
    ("batches", "p50", "p99"),
    [
        ([[("a", 0.03)]], 0.03, 0.03),
        # across cameras and batches, nearest rank: 4 values -> ranks 2 and 4
        ([[("a", 0.04), ("b", 0.01)], [("b", 0.03), ("a", 0.02)]], 0.02, 0.04),
        ([[("a", ms / 1000)] for ms in range(100, 0, -1)], 0.05, 0.099),  # 100..1 ms
        ([[("a", 0.0), ("b", 0.0), ("a", 0.5)]], 0.0, 0.5),
    ],
)
def test_queue_delay_percentiles_over_all_frames(
    batches: list[list[tuple[str, float]]], p50: float, p99: float
) -> None:
    accounting = Accounting(["a", "b"], max_batch_size=4, clock=FakeClock())
    for i, batch in enumerate(batches):
        # the end-to-end latency is 1 s for every frame: the delays must not be mixed with it
        accounting.on_published([(camera, 1.0, delay) for camera, delay in batch], float(i))
    summary = accounting.summary()
    assert summary.queue_delay_p50_s == pytest.approx(p50)
    assert summary.queue_delay_p99_s == pytest.approx(p99)
    assert summary.latency_p99_s == pytest.approx(1.0)


# --- decoder sessions, decode errors and earlier runs -------------------------------------------


@pytest.mark.parametrize(
    ("frames", "overflow", "decoded"),
    [
        ([("A", s) for s in range(5)] + [("B", s) for s in range(3)], 0, 5 + 3),
        # a restarted decoder whose first frames were trimmed: a new session, its gap overflow
        ([("A", s) for s in range(5)] + [("B", s) for s in range(3, 6)], 3, 5 + 6),
        # the same session going back is a redelivery, not a restart (seq alone would say so)
        ([("A", 0), ("A", 1), ("A", 2), ("A", 1)], 0, 3),
        # a new session starting at 0 while the old one had only reached 0
        ([("A", 0), ("B", 0), ("C", 0)], 0, 3),
    ],
)
def test_sessions_tell_restarts_from_redeliveries(frames, overflow: int, decoded: int) -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    for session, seq in frames:
        accounting.on_received("a", seq, session)
    summary = camera_summary(accounting, "a")
    assert summary.dropped.get("overflow", 0) == overflow
    assert summary.decoded == decoded


def test_the_end_of_a_session_never_read_counts_all_its_frames_as_overflow() -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    for seq in range(3):
        accounting.on_received("a", seq, "A")
    accounting.on_end("a", 5, "eof", "", 0, session="B")
    summary = camera_summary(accounting, "a")
    assert (summary.decoded, summary.dropped) == (3 + 5, {"overflow": 5})


def test_decode_errors_are_decoded_frames_dropped_so_the_totals_add_up() -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    for seq in range(10):
        accounting.on_received("a", seq, "A")
    accounting.on_published([("a", 0.01, 0.001)] * 8, published=1.0)
    accounting.on_shed("a", "stale")
    accounting.on_end("a", 10, "eof", "", 3, session="A")
    summary = camera_summary(accounting, "a")
    assert summary.decoded == 13
    assert summary.dropped == {"decode_error": 3, "stale": 1}
    assert summary.in_flight == 1  # received, neither processed nor dropped yet
    assert summary.decoded == summary.processed + sum(summary.dropped.values()) + 1


def test_frames_of_an_earlier_run_are_counted_apart() -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    accounting.on_previous_run("a")
    accounting.on_previous_run("a")
    accounting.on_received("a", 0, "A")
    accounting.on_published([("a", 0.01, 0.001)], published=1.0)
    summary = accounting.summary()
    (camera,) = summary.cameras
    assert (camera.decoded, camera.processed, camera.dropped) == (1, 1, {})
    assert camera.previous_run == summary.previous_run == 2
    assert summary.to_json()["previous_run"] == 2
    assert "(+2 left by an earlier run)" in summary.format()


@pytest.mark.parametrize(
    ("reason", "error", "failed"),
    [
        ("eof", "", False),
        ("stopped", "", False),  # a live camera stopped while streaming
        ("stopped", "camera 'door' (rtsp://u:***@h/x): cannot open: refused", True),
        ("error", "camera 'a': cannot open", True),
        ("crashed", "decoder process for camera 'a' died (exit code -9)", True),
    ],
)
def test_a_camera_that_did_not_reach_its_end_failed(reason: str, error: str, failed: bool):
    accounting = Accounting(["a"], clock=FakeClock())
    accounting.on_end("a", 0, reason, error, 0)
    assert camera_summary(accounting, "a").failed is failed


# --- Redis outages -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "end", "dropped"),
    [
        # seq 2-4 shed by the decoder while Redis was away (its count went 0 -> 3)
        ([(0, 0), (1, 0), (5, 3), (6, 3)], None, {"redis_down": 3}),
        # a gap of 4 of which 1 shed: the other 3 trimmed by the cap
        ([(0, 0), (5, 1)], None, {"redis_down": 1, "overflow": 3}),
        # shed at the very end: only the end entry says so
        ([(0, 0), (1, 0)], (5, 3), {"redis_down": 3}),
        # a count that grew without a gap (a frame was redelivered): nothing invented
        ([(0, 0), (1, 2)], None, {}),
    ],
)
def test_frames_shed_while_redis_was_away_are_told_from_overflow(frames, end, dropped):
    accounting = Accounting(["a"], clock=FakeClock())
    for seq, redis_down in frames:
        accounting.on_received("a", seq, "A", redis_down)
    if end is not None:
        accounting.on_end("a", end[0], "stopped", "", 0, session="A", redis_down=end[1])
    summary = camera_summary(accounting, "a")
    assert summary.dropped == dropped
    assert summary.decoded == summary.processed + sum(dropped.values()) + summary.in_flight


def test_what_a_restarted_redis_lost_is_the_next_gap() -> None:
    accounting = Accounting(["a", "b"], clock=FakeClock())
    accounting.on_received("a", 0, "A")
    accounting.on_received("b", 0, "B")
    accounting.on_redis_lost(["a", "b"])
    accounting.on_received("a", 4, "A")  # 1-3 were in the stream Redis lost
    accounting.on_received("b", 1, "B")  # nothing of b was lost
    accounting.on_received("b", 3, "B")  # a later gap is overflow again
    assert camera_summary(accounting, "a").dropped == {"redis_lost": 3}
    assert camera_summary(accounting, "b").dropped == {"overflow": 1}


def test_frames_sampled_out_are_counted_apart_from_decoded() -> None:
    accounting = Accounting(["a"], clock=FakeClock())
    for seq in range(4):
        accounting.on_received("a", seq, "S")
    accounting.on_end("a", 5, "eof", "", 0, "S", sampled_out=10)
    summary = camera_summary(accounting, "a")
    assert (summary.decoded, summary.sampled_out) == (5, 10)
    assert summary.dropped == {"overflow": 1}
    assert "(+10 sampled out)" in accounting.summary().format()


def test_a_summary_of_recent_frames_takes_each_cameras_newest_latencies() -> None:
    accounting = Accounting(["a"])
    for seq, latency in enumerate([5.0, 5.0, 0.1, 0.2, 0.3]):
        accounting.on_received("a", seq)
        accounting.on_published([("a", latency, 0.0)], float(seq))
    [everything] = accounting.summary().cameras
    [recent] = accounting.summary(recent=3).cameras
    assert everything.latency_p99_s == 5.0 and recent.latency_p99_s == 0.3
    assert recent.latency_p50_s == 0.2 and recent.processed == everything.processed == 5


def test_a_camera_added_while_running_is_in_the_summary_before_its_first_frame() -> None:
    accounting = Accounting(["a"])
    accounting.track("late")
    late = {c.camera: c for c in accounting.summary().cameras}["late"]
    assert (late.decoded, late.processed, late.dropped) == (0, 0, {})


# --- camera leases: a camera taken over from another worker -------------------------------


def test_a_taken_over_camera_follows_on_from_the_previous_workers_position():
    """The previous worker received seq 0-9 of session s (position 9) and left 8 and 9
    unfinished: they are claimed back, 10 follows on without a gap, 12 after 10 is a gap."""
    clock = FakeClock()
    accounting = Accounting(["cam"], clock=clock)
    accounting.adopt("cam", CameraPosition("s", 9))
    accounting.on_claimed("cam")
    accounting.on_claimed("cam")
    assert accounting.on_received("cam", 10, "s") == []
    (gap,) = accounting.on_received("cam", 12, "s")
    assert (gap.first_seq, gap.count, gap.cause) == (11, 1, "overflow")
    assert accounting.on_received("cam", 12, "s") is None  # a repeat, as before
    accounting.on_published([("cam", 0.1, 0.0)] * 4, clock())
    summary = camera_summary(accounting, "cam")
    # of the 13 frames so far, 8 were the previous worker's: 5 are this one's, all settled
    assert (summary.decoded, summary.handed_over, summary.processed) == (5, 8, 4)
    assert summary.dropped == {"overflow": 1} and summary.in_flight == 0
    assert accounting.position("cam") == CameraPosition("s", 12)


def test_a_camera_lost_to_another_worker_hands_its_waiting_frames_over():
    accounting = Accounting(["cam"])
    for seq in range(3):
        accounting.on_received("cam", seq, "s")
    accounting.on_published([("cam", 0.1, 0.0)], 0.0)
    # still in the batching queue: the other worker claims them
    accounting.hand_over("cam", [("s", 1), ("s", 2)])
    summary = camera_summary(accounting, "cam")
    assert (summary.decoded, summary.processed) == (1, 1)
    assert summary.in_flight == 0 and accounting.outstanding("cam") == 0
    assert accounting.position("cam") == CameraPosition("s", 0)


def test_frames_given_up_are_new_again_when_the_camera_comes_back_before_anyone_read_them():
    """Received to seq 10, seqs 9 and 10 waiting when the camera was lost; the next worker
    lost it too before it processed them (its position says 8): taken back, the two come back
    from this worker's pending list as frames to process, not repeats to acknowledge."""
    accounting = Accounting(["cam"])
    for seq in range(11):
        accounting.on_received("cam", seq, "s")
    accounting.on_published([("cam", 0.1, 0.0)] * 9, 0.0)
    accounting.hand_over("cam", [("s", 9), ("s", 10)])
    accounting.adopt("cam", CameraPosition("s", 8))
    assert accounting.on_received("cam", 9, "s") == []
    assert accounting.on_received("cam", 10, "s") == []
    accounting.on_published([("cam", 0.1, 0.0)] * 2, 0.0)
    summary = camera_summary(accounting, "cam")
    assert (summary.decoded, summary.processed, summary.handed_over) == (11, 11, 0)


def test_frames_given_up_that_are_not_the_newest_received_stay_handed_over():
    accounting = Accounting(["cam"])
    for seq in range(5):
        accounting.on_received("cam", seq, "s")
    accounting.on_published([("cam", 0.1, 0.0)] * 2, 0.0)
    accounting.hand_over("cam", [("s", 2), ("s", 3)])  # 4 went on (in a batch in flight)
    summary = camera_summary(accounting, "cam")
    assert (summary.decoded, summary.handed_over, summary.in_flight) == (3, 2, 1)
    assert accounting.position("cam") == CameraPosition("s", 4)


def test_adopting_a_camera_without_a_position_or_as_far_as_this_worker_changes_nothing():
    accounting = Accounting(["cam"])
    accounting.adopt("cam", CameraPosition())  # no worker received a frame yet
    assert accounting.position("cam") == CameraPosition()
    for seq in range(5):
        accounting.on_received("cam", seq, "s")
    accounting.adopt("cam", CameraPosition("s", 4))  # nobody read it since
    assert accounting.position("cam") == CameraPosition("s", 4)


def test_a_camera_taken_back_behind_this_worker_is_read_again_from_the_kept_position():
    """Received to seq 4, but what was written after seq 2 was refused (another worker held
    the lease by then) and that worker read nothing: taken back at position 2, seqs 3 and 4
    (pending still) are frames to count again, not repeats to acknowledge unrecorded."""
    accounting = Accounting(["cam"])
    for seq in range(5):
        accounting.on_received("cam", seq, "s")
    accounting.on_published([("cam", 0.1, 0.0)] * 5, 0.0)
    accounting.adopt("cam", CameraPosition("s", 2))
    assert accounting.position("cam") == CameraPosition("s", 2)
    assert accounting.on_received("cam", 3, "s") == []
    assert accounting.on_received("cam", 4, "s") == []
    (gap,) = accounting.on_received("cam", 6, "s")
    assert (gap.first_seq, gap.count, gap.cause) == (5, 1, "overflow")
    accounting.on_published([("cam", 0.1, 0.0)] * 3, 0.0)
    # 3 and 4 count twice in this worker's own figures (read then, refused, read again), which
    # still add up; Redis, which the audit reads, has them once
    summary = camera_summary(accounting, "cam")
    assert (summary.decoded, summary.processed, summary.dropped) == (9, 8, {"overflow": 1})
    assert summary.in_flight == 0 and accounting.outstanding("cam") == 0


def test_a_camera_handed_over_and_taken_back_follows_on_from_the_other_worker():
    """Read to seq 4 here, handed over; the other worker read to 9 and to another session's
    seq 2; taken back: the frames in between were the other worker's, and no gap shows."""
    accounting = Accounting(["cam"])
    for seq in range(5):
        accounting.on_received("cam", seq, "s")
    accounting.on_published([("cam", 0.1, 0.0)] * 5, 0.0)
    accounting.adopt("cam", CameraPosition("s", 9))
    assert accounting.on_received("cam", 10, "s") == []
    accounting.adopt("cam", CameraPosition("t", 2))  # the other worker saw s end, t begin
    assert accounting.on_received("cam", 3, "t") == []
    summary = camera_summary(accounting, "cam")
    assert (summary.decoded, summary.processed, summary.handed_over) == (7, 5, 8)
    assert summary.dropped == {} and summary.in_flight == 2  # 10 of s and 3 of t


def test_a_camera_position_survives_its_trip_through_redis_fields():
    for position in (CameraPosition(), CameraPosition("", 3), CameraPosition("s", 7, 2, True)):
        fields = {k.encode(): str(v).encode() for k, v in position.to_fields().items()}
        assert CameraPosition.from_fields(fields) == position
    assert CameraPosition.from_fields({}) == CameraPosition()


def test_a_position_knows_which_stream_entries_were_received():
    position = CameraPosition("s", 7, entry_id="1700000000123-4")
    assert position.received(b"1700000000123-4") and position.received("1700000000122-9")
    assert not position.received(b"1700000000123-5") and not position.received("1700000000124-0")
    assert not CameraPosition().received("1-0")
