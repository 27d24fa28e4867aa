"""The component tier: a real redis-server and the real batch worker, in process, with a
``FakeBackend`` instead of a model, for the paths a model would make slow to reach: a stage
that dies, frames another worker left pending, the run after a crash."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from detectors.base import BatchOutput, ModelInfo
from detectors.detector import Detector
from detectors.postprocess import Thresholds
from framebatch_tools.audit import audit
from pipeline.batching import make_policy
from pipeline.errors import StageFailed
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.stages.context import WorkerContext
from pipeline.stages.worker import BatchWorker
from pipeline.telemetry import Telemetry
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import EndOfStream, FrameMessage
from streams.sinks import SinkContext, SinkGroup, open_sinks
from streams.sinks.jsonl import Options as JsonLinesOptions
from streams.sinks.redis_streams import Options as RedisStreamsOptions

SIZE = 32


class FakeBackend:
    """Finds nothing, fast; fails at a chosen batch."""

    name = "fake"

    def __init__(self, fail_at_batch: int | None = None, seconds: float = 0.0):
        self.info = ModelInfo("fake", "fake", SIZE, SIZE, ("thing",))
        self.batches = 0
        self._fail_at = fail_at_batch
        self._seconds = seconds  # how long each inference takes

    def prepare(self, images):
        return np.stack(images)

    def infer(self, batch):
        time.sleep(self._seconds)
        self.batches += 1
        if self._fail_at is not None and self.batches >= self._fail_at:
            raise RuntimeError("injected inference failure")
        return BatchOutput(raw=np.zeros((len(batch), 5, 1), np.float32))  # score 0: nothing

    def warmup(self, sizes):
        pass

    def close(self):
        pass


def write_frames(client, keys: StreamKeys, camera: str, session: str, seqs, *, end: int | None):
    pixels = np.zeros((SIZE, SIZE, 3), np.uint8).tobytes()
    for seq in seqs:
        now = time.time()
        message = FrameMessage(
            camera, seq, None, SIZE, SIZE, 1.0, 0, 0, now, now, pixels, SIZE, SIZE, session=session
        )
        client.xadd(keys.frames(camera), message.to_fields())
    if end is not None:
        client.xadd(
            keys.frames(camera), EndOfStream(camera, end, "eof", session=session).to_fields()
        )


def worker(
    client,
    keys,
    cameras,
    backend,
    *,
    instances=(),
    since_ms=0,
    consumer="batcher-0",
    sink=None,
    telemetry=None,
    leases=None,
) -> BatchWorker:
    """``instances``: further backends, each running batches on a thread of its own.
    ``leases``: reads under camera leases (the test holds them, as ``consumer``)."""
    sink = sink or open_sinks([RedisStreamsOptions()], SinkContext(client, keys, 10_000))
    telemetry = telemetry or Telemetry()
    context = WorkerContext(
        redis=client,
        keys=keys,
        accounting=Accounting(cameras, telemetry=telemetry),
        acks=FrameAcks(
            redis_client=client,
            keys=keys,
            ledger_maxlen=10_000,
            lease_holder=None if leases is None else consumer,
        ),
        telemetry=telemetry,
        consumer=consumer,
    )
    return BatchWorker(
        context,
        cameras=cameras,
        detector=Detector(backend, thresholds=Thresholds(), instances=instances),
        policy=make_policy("batch1", max_batch_size=1, max_wait_ms=5),
        sink=sink,
        until_done=True,
        since_ms=since_ms,
        leases=leases,
    )


class SimulatedLeases:
    """The camera leases as a test holds them: reads wait while ``reading`` is clear; the
    cameras in ``lost`` went to another worker."""

    def __init__(self):
        self.reading = threading.Event()
        self.reading.set()
        self.lost: set[str] = set()

    def may_read(self) -> bool:
        return self.reading.is_set()

    def leased(self, camera: str) -> bool:
        return camera not in self.lost


def redis_now_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


@pytest.fixture
def keys(redis_client, prefix) -> StreamKeys:
    keys = StreamKeys(prefix)
    for camera in ("a", "b"):
        redis_client.xgroup_create(keys.frames(camera), FRAMES_GROUP, id="0", mkstream=True)
    return keys


def run_to_end(batch_worker: BatchWorker, timeout_s: float = 60) -> None:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            batch_worker.run(threading.Event())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the worker did not finish"
    if errors:
        raise errors[0]


def test_every_frame_is_published_once_and_the_ledger_has_each_end(redis_client, keys):
    write_frames(redis_client, keys, "a", "A", range(10), end=10)
    write_frames(redis_client, keys, "b", "B", [0, 1, 4], end=6)  # 2, 3 and 5 trimmed
    run_to_end(worker(redis_client, keys, ["a", "b"], FakeBackend()))
    reports = {r.camera: r for r in audit(redis_client, keys, ["a", "b"])}
    assert reports["a"].ok and (reports["a"].frames, reports["a"].detected) == (10, 10)
    assert reports["b"].ok and reports["b"].dropped == {"overflow": 3}
    assert redis_client.xlen(keys.frames("a")) == 0  # acknowledged and deleted


def test_a_dead_stage_stops_the_worker_and_acknowledges_nothing_unpublished(redis_client, keys):
    write_frames(redis_client, keys, "a", "A", range(12), end=12)
    backend = FakeBackend(fail_at_batch=4)
    with pytest.raises(StageFailed, match="injected inference failure"):
        run_to_end(worker(redis_client, keys, ["a"], backend))
    published = redis_client.xlen(keys.detections("a"))
    assert published == 3  # batches of one frame, the fourth failed
    # whatever was not published is still in the stream, for the next run
    left = redis_client.xrange(keys.frames("a"))
    assert len([e for e in left if e[1][b"kind"] == b"frame"]) == 12 - published


def test_the_run_after_a_crash_claims_and_accounts_for_everything(redis_client, keys):
    write_frames(redis_client, keys, "a", "A", range(12), end=None)
    with pytest.raises(StageFailed):
        run_to_end(worker(redis_client, keys, ["a"], FakeBackend(fail_at_batch=5)))
    assert redis_client.xpending(keys.frames("a"), FRAMES_GROUP)["pending"] > 0  # read, held
    # the next run, with another consumer name, and a new session of the decoder
    since = redis_now_ms(redis_client) + 1
    time.sleep(0.01)
    write_frames(redis_client, keys, "a", "A2", range(3), end=3)
    run_to_end(worker(redis_client, keys, ["a"], FakeBackend(), since_ms=since, consumer="x"))
    (report,) = audit(redis_client, keys, ["a"])
    assert report.ok, report.line()
    assert report.sessions == 2 and report.frames == 12 + 3
    assert report.detected + report.dropped["previous_run"] == 15
    assert redis_client.xpending(keys.frames("a"), FRAMES_GROUP)["pending"] == 0


@pytest.mark.parametrize("next_session", [False, True], ids=["quiet", "next-session"])
def test_an_end_entry_left_pending_on_another_worker_is_claimed(redis_client, keys, next_session):
    """A read carried out after the camera's lease moved on (held up by an outage) leaves a
    session's end entry pending on a worker that will never finish it, and no gap in ``seq``
    shows it: the camera's holder finds it once the camera is quiet, or when the next
    session's first frame arrives with the one before it not ended."""
    redis_client.set(keys.lease("a"), "batcher-0")
    write_frames(redis_client, keys, "a", "A", range(5), end=None)
    leases = SimulatedLeases()
    reading = leases.reading
    batch_worker = worker(redis_client, keys, ["a"], FakeBackend(), leases=leases, since_ms=0)
    finished = threading.Thread(target=run_to_end, args=(batch_worker,))
    finished.start()
    deadline = time.monotonic() + 60
    while redis_client.xlen(keys.detections("a")) < 5:
        assert time.monotonic() < deadline, "the frames were not published"
        time.sleep(0.05)
    reading.clear()  # the holder's reads wait ...
    time.sleep(0.3)  # ... past a read in flight (they block 100 ms at most)
    write_frames(redis_client, keys, "a", "A", [], end=5)
    stale = redis_client.xreadgroup(FRAMES_GROUP, "cut-off", {keys.frames("a"): ">"})
    assert len(stale[0][1]) == 1  # the end entry, delivered to a worker that lost the camera
    if next_session:
        write_frames(redis_client, keys, "a", "B", range(3), end=3)
    reading.set()
    finished.join()
    (report,) = audit(redis_client, keys, ["a"])
    assert report.ok, report.line()
    expected = (8, 8, 2) if next_session else (5, 5, 1)
    assert (report.frames, report.detected, report.sessions) == expected
    assert redis_client.xpending(keys.frames("a"), FRAMES_GROUP)["pending"] == 0


@pytest.mark.parametrize("seen_before", [True, False], ids=["after-a-session", "first-seen"])
def test_a_whole_session_left_pending_on_another_worker_is_claimed_at_the_next(
    redis_client, keys, seen_before
):
    """A short session (its first frame and its end) delivered in a reply that was set aside
    leaves no gap in ``seq`` anywhere: the session before it ended, the one after starts at 0.
    The next session's first frame looks for entries pending since the last one received; or,
    where the set-aside session was the camera's first here (a decoder that lost its lease at
    once: the 1,000-camera fleet's start left frames so for ever), since the stream's start."""
    redis_client.set(keys.lease("a"), "batcher-0")
    redis_client.set(keys.lease("z"), "batcher-0")
    if seen_before:
        write_frames(redis_client, keys, "a", "A", range(5), end=5)
    write_frames(redis_client, keys, "z", "Z", range(2), end=None)  # keeps the worker reading
    leases = SimulatedLeases()
    reading = leases.reading
    batch_worker = worker(redis_client, keys, ["a", "z"], FakeBackend(), leases=leases, since_ms=0)
    finished = threading.Thread(target=run_to_end, args=(batch_worker,))
    finished.start()
    deadline = time.monotonic() + 60
    while redis_client.xlen(keys.frames("a")) or redis_client.xlen(keys.detections("z")) < 2:
        assert time.monotonic() < deadline, "the worker did not start, or session A not end"
        time.sleep(0.05)
    reading.clear()
    time.sleep(0.3)  # past a read in flight
    write_frames(redis_client, keys, "a", "B", [0], end=1)
    stale = redis_client.xreadgroup(FRAMES_GROUP, "cut-off", {keys.frames("a"): ">"})
    assert len(stale[0][1]) == 2
    write_frames(redis_client, keys, "a", "C", range(3), end=3)
    write_frames(redis_client, keys, "z", "Z", [], end=2)
    reading.set()
    finished.join()
    report = {r.camera: r for r in audit(redis_client, keys, ["a", "z"])}["a"]
    assert report.ok, report.line()
    expected = (9, 9, 3) if seen_before else (4, 4, 2)
    assert (report.frames, report.detected, report.sessions) == expected
    assert redis_client.xpending(keys.frames("a"), FRAMES_GROUP)["pending"] == 0


def test_a_camera_lost_to_another_worker_is_left_to_it_before_the_reader_lets_it_go(
    redis_client, keys
):
    """The renewal that finds a camera's lease lost (this worker was cut off past the TTL)
    comes before the reader is told to let it go: meanwhile neither a read held up by the cut
    nor the quiet-tail sweep takes the camera's frames from the worker that holds it now (it
    took them as stolen: the gap they left was written off as overflow, frames it detected)."""
    for camera in ("a", "z"):
        redis_client.set(keys.lease(camera), "batcher-0")
    write_frames(redis_client, keys, "a", "A", range(5), end=None)
    leases = SimulatedLeases()
    batch_worker = worker(redis_client, keys, ["a", "z"], FakeBackend(), leases=leases, since_ms=0)
    stop = threading.Event()
    running = threading.Thread(target=batch_worker.run, args=(stop,))
    running.start()
    try:
        wait_until(lambda: redis_client.xlen(keys.detections("a")) == 5, "a's frames published")
        leases.reading.clear()  # cut off ...
        time.sleep(0.3)  # ... past a read in flight
        write_frames(redis_client, keys, "a", "A", range(5, 8), end=None)
        holder = redis_client.xreadgroup(FRAMES_GROUP, "holder", {keys.frames("a"): ">"})
        assert len(holder[0][1]) == 3  # the camera's new holder, mid-batch
        leases.lost.add("a")
        leases.reading.set()  # back: the renewal found a lost, the reader not told yet
        write_frames(redis_client, keys, "a", "A", range(8, 10), end=None)  # read here
        write_frames(redis_client, keys, "z", "Z", range(2), end=None)
        wait_until(lambda: redis_client.xlen(keys.detections("z")) == 2, "z's frames published")
        # z's end left on a cut-off consumer is found by the sweep, which goes over a first
        leases.reading.clear()
        time.sleep(0.3)
        write_frames(redis_client, keys, "z", "Z", [], end=2)
        redis_client.xreadgroup(FRAMES_GROUP, "cut-off", {keys.frames("z"): ">"})
        leases.reading.set()
        wait_until(
            lambda: redis_client.xpending(keys.frames("z"), FRAMES_GROUP)["pending"] == 0,
            "z's end claimed by the sweep",
        )
    finally:
        stop.set()
        running.join(60)
    pending = redis_client.xpending_range(keys.frames("a"), FRAMES_GROUP, "-", "+", 10)
    consumers = [p["consumer"].decode() for p in pending]
    assert consumers == ["holder"] * 3 + ["batcher-0"] * 2  # the holder claims both at the gap
    assert redis_client.xlen(keys.detections("a")) == 5
    assert not [f for _, f in redis_client.xrange(keys.ledger("a")) if f[b"kind"] == b"drop"]


def wait_until(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class FakeSink:
    """Keeps what it is given; fails at a chosen batch."""

    name = "fake"

    def __init__(self, fail_at_batch: int | None = None):
        self.batches: list[list[str]] = []
        self._fail_at = fail_at_batch

    def write(self, messages):
        if self._fail_at is not None and len(self.batches) + 1 >= self._fail_at:
            raise ConnectionError("injected sink failure")
        self.batches.append([m.frame_id for m in messages])

    def close(self):
        pass


class RecordingTelemetry(Telemetry):
    def __init__(self):
        self.received = self.published = self.inferred = 0
        self.dropped: dict[str, int] = {}
        self.failed: list[str] = []

    def frames_received(self, camera, count):
        self.received += count

    def frames_dropped(self, camera, cause, count):
        self.dropped[cause] = self.dropped.get(cause, 0) + count

    def frames_published(self, camera, latency_s, queue_delay_s):
        self.published += 1

    def batch_inferred(self, size, seconds):
        self.inferred += size

    def stage_failed(self, stage, error):
        self.failed.append(stage)


def test_every_sink_has_each_message_before_its_frame_is_acknowledged(redis_client, keys, tmp_path):
    write_frames(redis_client, keys, "a", "A", range(6), end=6)
    write_frames(redis_client, keys, "b", "B", range(4), end=4)
    lines = tmp_path / "detections.jsonl"
    sinks = open_sinks(
        [RedisStreamsOptions(), JsonLinesOptions(kind="jsonl", path=lines)],
        SinkContext(redis_client, keys, 10_000),
    )
    fake = FakeSink()
    run_to_end(
        worker(redis_client, keys, ["a", "b"], FakeBackend(), sink=SinkGroup([*sinks.sinks, fake]))
    )
    sinks.close()
    written = [json.loads(line)["frame_id"] for line in lines.read_text().splitlines()]
    assert sorted(written) == sorted(f"{s}:{n}" for s, c in (("A", 6), ("B", 4)) for n in range(c))
    assert [frame for batch in fake.batches for frame in batch] == written  # same order
    assert all(r.ok for r in audit(redis_client, keys, ["a", "b"]))


def test_a_failing_sink_acknowledges_nothing_it_did_not_write(redis_client, keys):
    write_frames(redis_client, keys, "a", "A", range(8), end=8)
    telemetry = RecordingTelemetry()
    sink = FakeSink(fail_at_batch=3)
    with pytest.raises(StageFailed, match="publish stage failed.*injected sink failure"):
        run_to_end(worker(redis_client, keys, ["a"], FakeBackend(), sink=sink, telemetry=telemetry))
    assert telemetry.failed == ["publish"]
    written = len(sink.batches)  # batches of one frame
    assert written == 2 and telemetry.published == written
    left = redis_client.xrange(keys.frames("a"))
    assert len([e for e in left if e[1][b"kind"] == b"frame"]) == 8 - written


def test_telemetry_hears_of_every_frame_once(redis_client, keys):
    write_frames(redis_client, keys, "a", "A", range(10), end=10)
    write_frames(redis_client, keys, "b", "B", [0, 1, 4, 5], end=7)  # 2, 3 and 6 trimmed
    telemetry = RecordingTelemetry()
    backend = FakeBackend()
    run_to_end(worker(redis_client, keys, ["a", "b"], backend, telemetry=telemetry))
    assert telemetry.received == 14 and telemetry.published == 14
    assert telemetry.dropped == {"overflow": 3}
    assert telemetry.inferred == 14 and backend.batches == 14


def test_instances_finishing_out_of_order_publish_in_dispatch_order(redis_client, keys):
    # one instance takes 25x as long as the other: batches finish out of order, and a camera's
    # detections must still come out in its frames' order, every frame once
    write_frames(redis_client, keys, "a", "A", range(12), end=12)
    write_frames(redis_client, keys, "b", "B", range(9), end=9)
    slow, fast = FakeBackend(seconds=0.05), FakeBackend(seconds=0.002)
    telemetry = RecordingTelemetry()
    run_to_end(worker(redis_client, keys, ["a", "b"], slow, instances=[fast], telemetry=telemetry))
    assert slow.batches and fast.batches > slow.batches  # both ran, the fast one more
    assert slow.batches + fast.batches == 21 == telemetry.published
    for camera, frames in (("a", 12), ("b", 9)):
        entries = redis_client.xrange(keys.detections(camera))
        seqs = [int(fields[b"seq"]) for _, fields in entries]
        assert seqs == list(range(frames))
    batch_ids = [
        int(fields[b"batch_id"])
        for camera in ("a", "b")
        for _, fields in redis_client.xrange(keys.detections(camera))
    ]
    assert sorted(batch_ids) == list(range(21))
    assert all(r.ok for r in audit(redis_client, keys, ["a", "b"]))
