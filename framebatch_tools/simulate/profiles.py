"""Service-time profiles of the detector for ``framebatch simulate``: seconds per batch by size.

A profile is either a linear model ``t(b) = a + c·b`` or a table of measured seconds per batch
size (linear in between, the last slope beyond).  ``sample`` adds seeded multiplicative noise
(log-normal), the jitter a real device shows from batch to batch.

* ``cpu_ort_2core`` — **measured** on the project's 2-core development machine: YOLOv8n 640,
  ONNX Runtime with 2 intra-op threads, ~15 images/s at every batch size from 1 to 8, so there is
  no batching gain (``a ≈ 0``, ``c ≈ 0.066 s``).  ``framebatch bench`` refines these figures; see
  ``docs/benchmarks.md``.
* ``gpu_a100_trt_model`` — a **model, not a measurement**.  The one published point is the
  Ultralytics YOLOv8 model table (https://docs.ultralytics.com/models/yolov8/, column
  "Speed A100 TensorRT (ms)"): 0.99 ms per image for YOLOv8n at 640, batch 1, TensorRT FP16.
  The batching gain is *assumed*: a marginal cost of 0.10 ms per image, so
  ``t(b) = 0.89 ms + 0.10 ms·b`` passes through the published point and gives ~7.8x more images/s
  at batch 32 than at batch 1 — about the gain Ultralytics publishes for YOLOv5n on a V100
  (6.3 ms at batch 1, 0.6 ms per image at batch 32, PyTorch; YOLOv5 README).  Re-fit it from
  ``framebatch bench`` on a real GPU before trusting absolute numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class ServiceProfile:
    """How long the detector takes for a batch of ``b`` frames."""

    name: str
    kind: Literal["measured", "model"]
    source: str  # where the numbers come from, in one line
    a_s: float = 0.0  # fixed cost per batch, seconds
    c_s: float = 0.0  # cost per image, seconds
    table: Mapping[int, float] = field(default_factory=dict)  # batch size -> seconds, if measured
    noise: float = 0.0  # sigma of the log-normal multiplicative noise (0: deterministic)
    max_batch_size: int = 8  # the largest batch the profile covers (and the sweep uses)
    frame_age_ms: float = 1000.0  # the freshness deadline the sweep gives live cameras

    def seconds(self, batch_size: int) -> float:
        """Mean service time of one batch."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if not self.table:
            return self.a_s + self.c_s * batch_size
        sizes = sorted(self.table)
        if batch_size in self.table:
            return self.table[batch_size]
        if batch_size < sizes[0]:
            return self.table[sizes[0]] * batch_size / sizes[0]
        lower = max((s for s in sizes if s < batch_size), default=sizes[0])
        upper = min((s for s in sizes if s > batch_size), default=None)
        if upper is None:  # beyond the table: the last measured slope
            if len(sizes) < 2:
                return self.table[lower] * batch_size / lower
            upper, lower = lower, sizes[-2]
        slope = (self.table[upper] - self.table[lower]) / (upper - lower)
        return self.table[lower] + slope * (batch_size - lower)

    def sample(self, batch_size: int, rng: random.Random) -> float:
        """One service time with noise (mean-preserving log-normal)."""
        mean = self.seconds(batch_size)
        if self.noise <= 0:
            return mean
        return mean * math.exp(rng.gauss(-0.5 * self.noise**2, self.noise))

    def p99_factor(self) -> float:
        """The 99th percentile of the noise multiplier (1 without noise)."""
        return math.exp(-0.5 * self.noise**2 + 2.326 * self.noise) if self.noise > 0 else 1.0

    def capacity(self, batch_size: int | None = None) -> float:
        """Frames per second the detector serves back to back at this batch size (default max)."""
        size = batch_size or self.max_batch_size
        return size / self.seconds(size)


PROFILES: dict[str, ServiceProfile] = {
    profile.name: profile
    for profile in (
        ServiceProfile(
            name="cpu_ort_2core",
            kind="measured",
            source=(
                "YOLOv8n 640, ONNX Runtime 2 threads on the 2-core dev machine: ~15 images/s at "
                "batch 1..8 (docs/benchmarks.md)"
            ),
            a_s=0.0,
            c_s=0.066,
            noise=0.05,
            max_batch_size=8,
            frame_age_ms=2000.0,
        ),
        ServiceProfile(
            name="gpu_a100_trt_model",
            kind="model",
            source=(
                "MODEL, not a measurement: t(b) = 0.89 ms + 0.10 ms*b through Ultralytics' "
                "published YOLOv8n A100 TensorRT 0.99 ms at batch 1; the batching gain is assumed"
            ),
            a_s=0.00089,
            c_s=0.00010,
            noise=0.05,
            max_batch_size=32,
            frame_age_ms=200.0,
        ),
    )
}


def get_profile(name: str) -> ServiceProfile:
    """A shipped profile by name, with the known names in the error."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})") from None
