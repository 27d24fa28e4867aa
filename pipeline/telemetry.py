"""The telemetry port: what a running batcher tells an observer (metrics, tracing).

``Telemetry`` does nothing; an exporter (Prometheus, OpenTelemetry...) subclasses it and
overrides what it needs.  The calls come from the batcher's threads, some under the
accounting's lock: an implementation must be thread-safe and cheap (update a counter, never
block on I/O).  Every frame a camera's decoders decoded ends in exactly one of
``frames_published`` or ``frames_dropped`` (the summary's accounting, event by event); frames an
earlier run left come as ``frames_dropped`` with cause ``previous_run``.
"""

from __future__ import annotations


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
