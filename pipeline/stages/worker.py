"""One batch worker: frames streams → batching policy → detector → sinks, for a share of the
cameras, as three stages on their own threads so the detector is never idle while work is
queued (:mod:`pipeline.stages`):

* reader (the caller's thread): reads frames, runs the policy, prepares batches;
* inferer: runs the backend on prepared batches, one thread per instance of the model;
* publisher: post-processes, writes detection messages to the sinks in dispatch order, then
  acknowledges.

The hand-offs hold one batch each, so about instances + 3 batches are in memory at once (a few
more while the publisher holds batches that finished before an earlier one).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import redis

from detectors.detector import Detector
from pipeline.batching import BatchPolicy
from pipeline.errors import StageFailed
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.stages.batches import InferredBatch, PendingFrame, PreparedBatch
from pipeline.stages.inferer import InferenceMeter, Inferer
from pipeline.stages.lifecycle import Handoff, Lifecycle
from pipeline.stages.publisher import Publisher
from pipeline.stages.reader import CameraChanges, FrameReader
from pipeline.telemetry import NO_TELEMETRY, Telemetry
from streams.keys import StreamKeys
from streams.sinks import DetectionSink
from streams.transport import FrameDecoder

__all__ = ["BatchWorker", "PendingFrame", "StageFailed"]


class BatchWorker:
    """Runs the three stages until ``stop`` is set, or until every camera ended (``until_done``)."""

    def __init__(
        self,
        *,
        redis_client: redis.Redis,
        keys: StreamKeys,
        cameras: list[str],
        detector: Detector,
        policy: BatchPolicy[PendingFrame],
        accounting: Accounting,
        sink: DetectionSink,
        ledger_maxlen: int,
        until_done: bool,
        frame_decoder: FrameDecoder | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
        consumer_name: str = "batcher-0",
        since_ms: int = 0,
        track_positions: bool = False,
        clock: Callable[[], float] = time.time,
    ):
        """``since_ms``: Redis time at which this run began; older entries are an earlier run's.
        ``frame_decoder``: reads pixels of every transport; the worker closes it when it ends.
        ``sink``: where detection messages go (the caller opens and closes it)."""
        self._redis = redis_client
        self._keys = keys
        self._cameras = cameras
        self._detector = detector
        self._policy = policy
        self._accounting = accounting
        self._sink = sink
        self._acks = FrameAcks(
            redis_client=redis_client,
            keys=keys,
            ledger_maxlen=ledger_maxlen,
            # a detector worker's consumer name is its worker id, which holds its leases
            lease_holder=consumer_name if track_positions else None,
        )
        self._until_done = until_done
        self._frames = frame_decoder or FrameDecoder()
        self._telemetry = telemetry
        self._consumer = consumer_name
        self._since_ms = since_ms
        self._track_positions = track_positions  # camera leases: see FrameReader
        self._clock = clock
        #: cameras added, re-prioritised or let go while running (from any thread)
        self.changes = CameraChanges()
        #: false while this worker may not read (its camera leases may have run out)
        self.may_read: Callable[[], bool] = lambda: True

    @property
    def instances(self) -> int:
        return self._detector.instances

    @property
    def cameras(self) -> list[str]:
        """The cameras this worker was given at start (later changes go through ``changes``)."""
        return self._cameras

    def run(self, stop: threading.Event) -> None:
        """Serve until stopped or done; always finishes and publishes the batches in flight.
        Raises ``StageFailed`` when a stage died (what it had not published stays pending)."""
        lifecycle = Lifecycle(stop, self._telemetry)
        prepared: Handoff[PreparedBatch] = lifecycle.handoff()
        inferred: Handoff[InferredBatch] = lifecycle.handoff()
        meter = InferenceMeter(self._detector.instances)
        reader = FrameReader(
            lifecycle=lifecycle,
            redis_client=self._redis,
            keys=self._keys,
            cameras=self._cameras,
            detector=self._detector,
            policy=self._policy,
            accounting=self._accounting,
            acks=self._acks,
            outbox=prepared,
            meter=meter,
            frame_decoder=self._frames,
            until_done=self._until_done,
            consumer_name=self._consumer,
            since_ms=self._since_ms,
            changes=self.changes,
            track_positions=self._track_positions,
            may_read=lambda: self.may_read(),
            clock=self._clock,
        )
        inferer = Inferer(
            detector=self._detector,
            inbox=prepared,
            outbox=inferred,
            meter=meter,
            telemetry=self._telemetry,
            clock=self._clock,
        )
        publisher = Publisher(
            detector=self._detector,
            inbox=inferred,
            sink=self._sink,
            acks=self._acks,
            keys=self._keys,
            accounting=self._accounting,
            telemetry=self._telemetry,
            clock=self._clock,
        )
        try:
            try:
                reader.claim_pending()
                for instance in range(self._detector.instances):
                    lifecycle.start("infer", functools.partial(inferer.run, instance))
                lifecycle.start("publish", publisher.run)
                reader.run()
            except BaseException as exc:  # noqa: BLE001 - the reader fails like any stage
                lifecycle.fail("read", exc)  # the stages started stop waiting
        finally:
            lifecycle.join()
            self._frames.close()
        lifecycle.raise_failure()
