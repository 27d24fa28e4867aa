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

log = logging.getLogger(__name__)


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

    def stage_failed(self, stage: str, error: BaseException) -> None:
        """A stage of a batch worker died; the run ends with exit code 3."""


NO_TELEMETRY = Telemetry()


class GuardedTelemetry(Telemetry):
    """Forwards every event to an exporter; an exception there is logged (once per event
    kind) and swallowed: metrics must not stop the pipeline or split an accounting step."""

    def __init__(self, inner: Telemetry):
        self._inner = inner
        self._reported: set[str] = set()

    def _forward(self, event: str, *args: object) -> None:
        try:
            getattr(self._inner, event)(*args)
        except Exception:  # noqa: BLE001 - an exporter's bug is logged, never fatal
            if event not in self._reported:
                self._reported.add(event)
                log.exception("telemetry %s failed (reported once)", event)

    def frames_received(self, camera: str, count: int) -> None:
        self._forward("frames_received", camera, count)

    def frames_dropped(self, camera: str, cause: str, count: int) -> None:
        self._forward("frames_dropped", camera, cause, count)

    def frames_published(self, camera: str, latency_s: float, queue_delay_s: float) -> None:
        self._forward("frames_published", camera, latency_s, queue_delay_s)

    def batch_inferred(self, size: int, seconds: float) -> None:
        self._forward("batch_inferred", size, seconds)

    def stage_failed(self, stage: str, error: BaseException) -> None:
        self._forward("stage_failed", stage, error)
