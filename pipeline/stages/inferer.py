"""The inferer stage: runs the detector on prepared batches, one per instance of the model at a
time, each instance on a thread of its own (ONNX Runtime and CUDA release the GIL, so the
instances, the reader and the publisher go on meanwhile)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

from detectors.detector import Detector
from pipeline.stages.batches import InferredBatch, PreparedBatch
from pipeline.stages.context import WorkerContext
from pipeline.stages.lifecycle import Handoff


class InferenceMeter:
    """The inferer's timing, read by the reader: how long until an instance of the detector is
    free (the policy's start delay) and how long finished inferences took (its model of t(b))."""

    def __init__(self, instances: int = 1) -> None:
        self._instances = instances
        self._lock = threading.Lock()
        self._running: dict[int, tuple[float, int]] = {}  # instance: (perf_counter, size)
        self._finished: queue.SimpleQueue[tuple[int, float]] = queue.SimpleQueue()

    def started(self, size: int, instance: int = 0) -> None:
        with self._lock:
            self._running[instance] = (time.perf_counter(), size)

    def finished(self, instance: int = 0) -> float:
        """Seconds the instance's running inference took."""
        with self._lock:
            started, size = self._running.pop(instance)
        seconds = time.perf_counter() - started
        self._finished.put((size, seconds))
        return seconds

    def busy_for(self, estimate: Callable[[int], float]) -> float:
        """Expected seconds until an instance is free (0 when one is)."""
        with self._lock:
            running = list(self._running.values())
        if len(running) < self._instances:
            return 0.0
        ends = min(started + estimate(size) for started, size in running)
        return max(0.0, ends - time.perf_counter())

    def samples(self) -> Iterator[tuple[int, float]]:
        """(batch size, seconds) of the inferences finished since the last call."""
        while not self._finished.empty():
            yield self._finished.get()


class Inferer:
    """Takes prepared batches from one hand-off on one thread per instance of the detector;
    batches may finish out of order (the publisher puts them back in order)."""

    def __init__(
        self,
        context: WorkerContext,
        *,
        detector: Detector,
        inbox: Handoff[PreparedBatch],
        outbox: Handoff[InferredBatch],
        meter: InferenceMeter,
    ):
        self._detector = detector
        self._inbox = inbox
        self._outbox = outbox
        self._meter = meter
        self._telemetry = context.telemetry
        self._clock = context.clock
        self._lock = threading.Lock()
        self._running = detector.instances  # instances not yet finished

    def run(self, instance: int = 0) -> None:
        """One instance's loop; the last instance to end closes the outbox."""
        try:
            for batch in self._inbox:
                self._meter.started(len(batch.frames), instance)
                output = self._detector.infer(batch.tensor, instance)
                seconds = self._meter.finished(instance)
                self._telemetry.batch_inferred(len(batch.frames), seconds)
                self._outbox.put(InferredBatch(batch, output, self._clock()))
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                self._outbox.close()
