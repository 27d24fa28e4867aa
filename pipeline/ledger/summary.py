"""The run summary printed at the end of ``framebatch run`` (and returned to Python callers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, -(-q * len(sorted_values) // 100))  # ceil without float rounding
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class CameraSummary:
    """One camera's frames: ``decoded`` (frames read from the source, those lost in decoding
    included) = ``processed`` + sum of ``dropped`` by cause + ``in_flight``.  ``previous_run``
    frames were decoded by an earlier run, and ``sampled_out`` frames were decoded but not
    taken (``vid_stride``, ``max_fps``); ``handed_over`` frames were received by the
    detector worker that read the camera before this one (leases); all are outside that sum."""

    camera: str
    decoded: int
    processed: int
    dropped: dict[str, int]
    end_reason: str
    error: str
    latency_p50_s: float | None
    latency_p99_s: float | None
    previous_run: int = 0
    handed_over: int = 0
    sampled_out: int = 0

    @property
    def in_flight(self) -> int:
        """Decoded, neither processed nor dropped yet (waiting in Redis or in a batch)."""
        return self.decoded - self.processed - sum(self.dropped.values())

    @property
    def failed(self) -> bool:
        """The camera did not reach its end: its source failed, its decoder died, or a live
        camera was stopped while it could not connect."""
        return self.end_reason in ("error", "crashed") or bool(self.error)


@dataclass(frozen=True)
class RunSummary:
    cameras: tuple[CameraSummary, ...]
    batches: int
    batch_sizes: dict[int, int]
    mean_batch_size: float
    batch_fill_ratio: float  # mean batch size / max batch size
    queue_delay_p50_s: float | None  # enqueued by the decoder -> dispatched in a batch
    queue_delay_p99_s: float | None
    wall_s: float  # from the batcher's start to the summary
    processing_s: float  # from the first to the last published batch
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_p99_s: float | None

    @property
    def processed(self) -> int:
        return sum(c.processed for c in self.cameras)

    @property
    def dropped(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for camera in self.cameras:
            for cause, count in camera.dropped.items():
                totals[cause] = totals.get(cause, 0) + count
        return totals

    @property
    def previous_run(self) -> int:
        return sum(c.previous_run for c in self.cameras)

    @property
    def throughput_fps(self) -> float:
        return self.processed / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            processed=self.processed,
            dropped=self.dropped,
            previous_run=self.previous_run,
            throughput_fps=self.throughput_fps,
        )
        for camera, summary in zip(data["cameras"], self.cameras, strict=True):
            camera["in_flight"] = summary.in_flight
        return data

    def format(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.0f} ms"

        lines = ["framebatch summary"]
        for c in self.cameras:
            dropped = (
                ", ".join(f"{cause} {n}" for cause, n in sorted(c.dropped.items()) if n) or "none"
            )
            status = f"{c.end_reason}: {c.error}" if c.error else (c.end_reason or "running")
            extra = f", in flight {c.in_flight}" if c.in_flight else ""
            extra += f" (+{c.previous_run} left by an earlier run)" if c.previous_run else ""
            extra += f" (+{c.sampled_out} sampled out)" if c.sampled_out else ""
            extra += f" (+{c.handed_over} read by another worker first)" if c.handed_over else ""
            lines.append(
                f"  camera {c.camera}: decoded {c.decoded} = processed {c.processed} + "
                f"dropped {dropped}{extra}; latency p50 {ms(c.latency_p50_s)} "
                f"p99 {ms(c.latency_p99_s)} ({status})"
            )
        dropped_total = (
            ", ".join(f"{k} {v}" for k, v in sorted(self.dropped.items()) if v) or "none"
        )
        lines += [
            f"  frames processed {self.processed}, dropped {dropped_total}",
            f"  batches {self.batches}, mean batch size {self.mean_batch_size:.2f} "
            f"(fill {self.batch_fill_ratio:.0%}), sizes "
            + " ".join(f"{size}x{count}" for size, count in self.batch_sizes.items()),
            f"  queue delay p50 {ms(self.queue_delay_p50_s)}, p99 {ms(self.queue_delay_p99_s)}",
            f"  throughput {self.throughput_fps:.1f} frames/s over {self.wall_s:.1f} s",
            f"  end-to-end latency p50 {ms(self.latency_p50_s)}, p90 {ms(self.latency_p90_s)}, "
            f"p99 {ms(self.latency_p99_s)}",
        ]
        return "\n".join(lines)
