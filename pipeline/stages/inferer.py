"""The inferer stage: runs the detector on prepared batches, one at a time (ONNX Runtime and
CUDA release the GIL, so the reader and publisher go on meanwhile)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

from detectors.detector import Detector
from pipeline.stages.batches import InferredBatch, PreparedBatch
from pipeline.stages.lifecycle import Handoff
from pipeline.telemetry import Telemetry


class InferenceMeter:
    """The inferer's timing, read by the reader: how long the running inference still has to
    go (the policy's start delay) and how long finished ones took (its model of t(b))."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: tuple[float, int] | None = None  # (perf_counter at start, size)
        self._finished: queue.SimpleQueue[tuple[int, float]] = queue.SimpleQueue()

    def started(self, size: int) -> None:
        with self._lock:
            self._running = (time.perf_counter(), size)

    def finished(self) -> float:
        """Seconds the running inference took."""
        with self._lock:
            assert self._running is not None, "finished() without started()"
            started, size = self._running
            self._running = None
        seconds = time.perf_counter() - started
        self._finished.put((size, seconds))
        return seconds

    def busy_for(self, estimate: Callable[[int], float]) -> float:
        """Expected seconds until the running inference ends (0 when the detector is free)."""
        with self._lock:
            running = self._running
        if running is None:
            return 0.0
        started, size = running
        return max(0.0, started + estimate(size) - time.perf_counter())

    def samples(self) -> Iterator[tuple[int, float]]:
        """(batch size, seconds) of the inferences finished since the last call."""
        while not self._finished.empty():
            yield self._finished.get()


class Inferer:
    def __init__(
        self,
        *,
        detector: Detector,
        inbox: Handoff[PreparedBatch],
        outbox: Handoff[InferredBatch],
        meter: InferenceMeter,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.time,
    ):
        self._detector = detector
        self._inbox = inbox
        self._outbox = outbox
        self._meter = meter
        self._telemetry = telemetry
        self._clock = clock

    def run(self) -> None:
        try:
            for batch in self._inbox:
                self._meter.started(len(batch.frames))
                raw = self._detector.infer(batch.tensor)
                self._telemetry.batch_inferred(len(batch.frames), self._meter.finished())
                self._outbox.put(InferredBatch(batch, raw, self._clock()))
        finally:
            self._outbox.close()
