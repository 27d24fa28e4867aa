"""Online model of the detector's service time: ``t(b) = a + c·b``, learned from finished batches,
and each batch size's own recent time.

Exponentially weighted least squares over (batch size, seconds), so the model follows a device
that warms up, throttles or is shared.  Until two different sizes have been seen the slope is
unknown; the model then assumes the time is proportional to the batch (no batching gain), the
cautious choice for deciding how long to wait.

The line is what waits and deadlines are planned with.  Which batch size gives the most images a
second is read from each size's own measured time where that size has run: on a CPU the cost per
image grows with the batch (a batch's activations outgrow the core's caches: two one-thread
ONNX Runtime sessions side by side do 47 images/s in batches of 1 and 37 in batches of 8 here,
docs/benchmarks.md), which no line with ``a >= 0`` can show; on a GPU the measured times say the
opposite, and the same rule picks the large batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SIZE_WEIGHT = 0.2  # a new batch's weight in its size's mean time: a few batches follow a change


@dataclass
class ServiceModel:
    a: float = 0.0  # fixed cost per batch, seconds (prior)
    c: float = 0.0  # cost per image, seconds (prior)
    decay: float = 0.98  # weight kept by older observations at each new one
    _w: float = 0.0
    _b: float = 0.0
    _t: float = 0.0
    _bb: float = 0.0
    _bt: float = 0.0
    fitted: bool = False  # both terms fitted (two or more sizes seen), not the fallback
    _measured: dict[int, float] = field(default_factory=dict)  # seconds by batch size (EWMA)

    @property
    def observed(self) -> bool:
        return self._w > 0

    def observe(self, batch_size: int, seconds: float) -> None:
        d = self.decay
        self._w = d * self._w + 1
        self._b = d * self._b + batch_size
        self._t = d * self._t + seconds
        self._bb = d * self._bb + batch_size * batch_size
        self._bt = d * self._bt + batch_size * seconds
        spread = self._w * self._bb - self._b * self._b
        if spread > 1e-6 * self._w * self._w:  # at least two sizes seen: fit both terms
            slope = (self._w * self._bt - self._b * self._t) / spread
            self.c = max(slope, 0.0)
            self.a = max((self._t - self.c * self._b) / self._w, 0.0)
            self.fitted = True
        else:  # one size so far: proportional to the batch
            self.a, self.c = 0.0, self._t / self._b
            self.fitted = False
        last = self._measured.get(batch_size)
        self._measured[batch_size] = (
            seconds if last is None else last + SIZE_WEIGHT * (seconds - last)
        )

    def estimate(self, batch_size: int) -> float:
        return self.a + self.c * batch_size

    def throughput(self, batch_size: int) -> float:
        """Images per second at this batch size: from its own measured time where it has run,
        else from the line (inf when nothing is known)."""
        seconds = self._measured.get(batch_size) or self.estimate(batch_size)
        return batch_size / seconds if seconds > 0 else float("inf")
