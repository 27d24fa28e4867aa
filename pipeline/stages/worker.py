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

from detectors.detector import Detector
from pipeline.analytics.stage import AnalyticsSettings, FrameAnalyser
from pipeline.analytics.store import AnalyticsStore
from pipeline.batching import BatchPolicy
from pipeline.errors import StageFailed
from pipeline.stages.batches import InferredBatch, PendingFrame, PreparedBatch
from pipeline.stages.changes import CameraChanges
from pipeline.stages.context import WorkerContext
from pipeline.stages.handover import NO_HANDOVER, CameraHandover, LeaseGate
from pipeline.stages.inferer import InferenceMeter, Inferer
from pipeline.stages.lifecycle import Handoff, Lifecycle
from pipeline.stages.publisher import Publisher
from pipeline.stages.reader import FrameReader
from streams.sinks import DetectionSink
from streams.transport import FrameDecoder

__all__ = ["BatchWorker", "PendingFrame", "StageFailed"]


class BatchWorker:
    """Runs the three stages until ``stop`` is set, or until every camera ended once
    ``finish`` is set (``until_done``: from the start)."""

    def __init__(
        self,
        context: WorkerContext,
        *,
        cameras: list[str],
        detector: Detector,
        policy: BatchPolicy[PendingFrame],
        sink: DetectionSink,
        until_done: bool,
        since_ms: int = 0,
        frame_decoder: FrameDecoder | None = None,
        changes: CameraChanges | None = None,
        leases: LeaseGate | None = None,
        analytics: AnalyticsSettings | None = None,
        events_maxlen: int = 100_000,
    ):
        """``since_ms``: Redis time at which this run began; older entries are an earlier run's.
        ``frame_decoder``: reads pixels of every transport; the worker closes it when it ends.
        ``sink``: where detection messages go (the caller opens and closes it).  ``changes``:
        cameras added, re-prioritised or let go while running (from any thread).
        ``leases``: the camera leases' gate (``framebatch detect``): cameras move between
        workers, each camera's position is kept in Redis, reads wait while the leases may have
        run out, and a camera whose lease was lost is left alone.
        ``analytics``: each camera's analytics settings (None: no camera has any);
        ``events_maxlen``: the length each camera's events stream is capped at."""
        if leases is not None and context.acks.lease_holder != context.consumer:
            raise ValueError(
                "a worker under camera leases writes positions fenced by its consumer name: "
                "its context's acks must hold the leases as that consumer"
            )
        self._context = context
        self._cameras = cameras
        self._detector = detector
        self._policy = policy
        self._sink = sink
        self._until_done = until_done
        self._since_ms = since_ms
        self._frames = frame_decoder or FrameDecoder()
        self.changes = changes or CameraChanges()
        self._leases = leases
        self._analytics = analytics
        self._events_maxlen = events_maxlen

    @property
    def instances(self) -> int:
        return self._detector.instances

    def analyser(self) -> FrameAnalyser | None:
        """The publisher's analytics step (None when no camera has analytics)."""
        if self._analytics is None:
            return None
        info = self._detector.info
        return FrameAnalyser(
            settings=self._analytics,
            store=AnalyticsStore(self._context.redis, self._context.keys),
            label=info.label,
            classes=len(info.class_names),
        )

    @property
    def cameras(self) -> list[str]:
        """The cameras this worker was given at start (later changes go through ``changes``)."""
        return self._cameras

    def run(self, stop: threading.Event, finish: threading.Event | None = None) -> None:
        """Serve until stopped or done; always finishes and publishes the batches in flight.
        ``finish``: once set (a run stopping gracefully), read on until every camera ended.
        Raises ``StageFailed`` when a stage died (what it had not published stays pending)."""
        context = self._context
        lifecycle = Lifecycle(stop, context.telemetry)
        prepared: Handoff[PreparedBatch] = lifecycle.handoff()
        inferred: Handoff[InferredBatch] = lifecycle.handoff()
        meter = InferenceMeter(self._detector.instances)
        handover = (
            NO_HANDOVER if self._leases is None else CameraHandover(context, leases=self._leases)
        )
        finish = finish or threading.Event()
        if self._until_done:
            finish.set()
        reader = FrameReader(
            context,
            lifecycle=lifecycle,
            cameras=self._cameras,
            detector=self._detector,
            policy=self._policy,
            outbox=prepared,
            meter=meter,
            frame_decoder=self._frames,
            finish=finish,
            since_ms=self._since_ms,
            changes=self.changes,
            handover=handover,
        )
        inferer = Inferer(
            context, detector=self._detector, inbox=prepared, outbox=inferred, meter=meter
        )
        publisher = Publisher(
            context,
            detector=self._detector,
            inbox=inferred,
            sink=self._sink,
            analyser=self.analyser(),
            events_maxlen=self._events_maxlen,
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
