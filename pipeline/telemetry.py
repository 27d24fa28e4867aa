"""The telemetry port: what a running batcher tells an observer (metrics, tracing).

``Telemetry`` does nothing; an exporter (Prometheus, OpenTelemetry...) subclasses it and
overrides what it needs.  The calls come from the batcher's threads, some under the
accounting's lock: an implementation must be thread-safe and cheap (update a counter, never
block on I/O); the daemon wraps it in :class:`GuardedTelemetry`, so an exporter that raises
loses its own event, never a frame or a stage.  Every frame a camera's decoders decoded ends
in exactly one of ``frames_published`` or ``frames_dropped`` (the summary's accounting, event
by event); frames an earlier run left come as ``frames_dropped`` with cause ``previous_run``
(the ledger keeps the finer cause).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from detectors.postprocess import ImageDetections
from detectors.preprocess import LetterboxGeometry
from pipeline.config.analytics import AnalyticsConfig
from streams.messages import DetectionMessage, Timestamps
from streams.object_events import ObjectEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DetectedFrame:
    """A frame as the detector saw it (letterboxed pixels, shared: read only) and its
    detections in the original frame's pixels."""

    seq: int
    pixels: np.ndarray
    geometry: LetterboxGeometry
    detections: ImageDetections
    #: as published, where analytics ran: filtered, with track ids (drawn instead)
    published: DetectionMessage | None = None
    #: the analytics settings it was analysed with (its zones and lines are drawn)
    analytics: AnalyticsConfig | None = None


class Telemetry:
    """No-op observer; override the events you export."""

    def frames_received(self, camera: str, count: int) -> None:
        """Frames read from the camera's frames stream (before the batching policy)."""

    def frames_dropped(self, camera: str, cause: str, count: int) -> None:
        """Frames that will have no detection message, with their cause (``overflow``,
        ``stale``, ``decode_error``, ``previous_run``...)."""

    def frames_published(self, camera: str, latency_s: float, queue_delay_s: float) -> None:
        """A frame's detection message is written by every sink; ``latency_s`` from capture,
        ``queue_delay_s`` spent in the batching queue."""

    def batch_inferred(self, size: int, seconds: float) -> None:
        """The detector ran a batch of ``size`` frames in ``seconds``."""

    def frame_detected(self, camera: str, stamps: Timestamps, frame: DetectedFrame) -> None:
        """A published frame's stage times (captured → enqueued → batched → inferred →
        published) and its letterboxed pixels with their detections (for a live view: keep a
        reference, never copy or encode here)."""

    def objects_analysed(self, events: Sequence[ObjectEvent]) -> None:
        """A batch's analytics events (tracks, zones, lines), in order."""

    def zones_occupied(self, camera: str, occupancy: Mapping[str, Mapping[str, int]]) -> None:
        """The tracks in each of the camera's zones now, by label (after a batch)."""

    def stage_failed(self, stage: str, error: BaseException) -> None:
        """A stage of a batch worker died; the run ends with exit code 3."""


NO_TELEMETRY = Telemetry()


class GuardedTelemetry(Telemetry):
    """Forwards every event to each exporter; an exception there is logged (once per
    exporter and event kind) and swallowed: metrics must not stop the pipeline or split an
    accounting step, and one exporter's bug does not cost another its events."""

    def __init__(self, *exporters: Telemetry):
        self._exporters = exporters
        self._reported: set[tuple[int, str]] = set()

    def _forward(self, event: str, *args: object) -> None:
        for index, exporter in enumerate(self._exporters):
            try:
                getattr(exporter, event)(*args)
            except Exception:  # noqa: BLE001 - an exporter's bug is logged, never fatal
                if (index, event) not in self._reported:
                    self._reported.add((index, event))
                    log.exception("telemetry %s of %r failed (reported once)", event, exporter)

    def frames_received(self, camera: str, count: int) -> None:
        self._forward("frames_received", camera, count)

    def frames_dropped(self, camera: str, cause: str, count: int) -> None:
        self._forward("frames_dropped", camera, cause, count)

    def frames_published(self, camera: str, latency_s: float, queue_delay_s: float) -> None:
        self._forward("frames_published", camera, latency_s, queue_delay_s)

    def batch_inferred(self, size: int, seconds: float) -> None:
        self._forward("batch_inferred", size, seconds)

    def frame_detected(self, camera: str, stamps: Timestamps, frame: DetectedFrame) -> None:
        self._forward("frame_detected", camera, stamps, frame)

    def objects_analysed(self, events: Sequence[ObjectEvent]) -> None:
        self._forward("objects_analysed", events)

    def zones_occupied(self, camera: str, occupancy: Mapping[str, Mapping[str, int]]) -> None:
        self._forward("zones_occupied", camera, occupancy)

    def stage_failed(self, stage: str, error: BaseException) -> None:
        self._forward("stage_failed", stage, error)
