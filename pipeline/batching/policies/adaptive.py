"""``adaptive`` (the default): work-conserving.  It dispatches at once unless the measured
arrival rate and the learned service time say the detector cannot keep up at this batch size;
then it waits for the smallest batch that keeps up at ``target_utilisation``, never past a
frame's window (``max_wait_frames`` of its own camera's frame interval, capped by
``max_wait_ms``).  It scales up at once, down only after ``hold`` consecutive decisions (the
stability guard), snapped to preferred sizes.  Where throughput is all that counts (a file job's
backlog, or more frames than any batch size keeps up with) it takes the smallest batch with
(nearly) the best measured throughput: the largest on a GPU, often one on a CPU (service.py).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from pipeline.batching.policies.base import BatchPolicy, PolicyOptions, SharedSettings, T

EFFICIENT_SHARE = 0.99  # a batch within 1 % of the best throughput is "efficient"


class Options(PolicyOptions):
    name: Literal["adaptive"] = Field("adaptive", description="The policy these settings are for")
    target_utilisation: float = Field(
        0.85,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="adaptive: the detector load it batches for",
    )


class AdaptivePolicy(BatchPolicy[T]):
    name = "adaptive"

    def __init__(self, *, target_utilisation: float = 0.85, hold: int = 8, **kwargs):
        super().__init__(**kwargs)
        if not 0 < target_utilisation <= 1:
            raise ValueError("target_utilisation must be in (0, 1]")
        self.target_utilisation = target_utilisation
        self.hold = hold
        self.target = 1
        self._lower_streak = 0

    def keeps_up(self, batch_size: int, rate: float) -> bool:
        """Whether batches of this size serve ``rate`` frames/s at the target utilisation."""
        return rate * self.service.estimate(batch_size) <= self.target_utilisation * batch_size

    def _update_target(self, now: float) -> int:
        rate = self.queues.arrival_rate(now)
        sizes = range(1, self.max_batch_size + 1)
        raw = next((b for b in sizes if self.keeps_up(b, rate)), None)
        if rate == math.inf and not self.service.fitted:
            # a file job's backlog, one size seen (at the start, or once the line forgot the
            # other after some hundred batches of one size): full batches measure t(b) again
            raw = self.max_batch_size
        elif rate == math.inf or raw is None:
            # a file job's backlog, or nothing keeps up: throughput is all that counts, so the
            # smallest batch with (nearly) the best measured throughput (on a CPU often a small
            # one, service.py)
            raw = self.efficient_size()
        # engine-friendly sizes, except at low load, where one frame alone keeps up
        snapped = raw if raw == 1 else next((p for p in self.preferred if p >= raw), raw)
        if snapped >= self.target or rate == math.inf:
            # falling behind costs more than a larger batch, and a backlog has no traffic to be
            # steady for: follow at once
            self.target, self._lower_streak = snapped, 0
        else:  # stability guard: shrink only when the lower target holds for a while
            self._lower_streak += 1
            if self._lower_streak >= self.hold:
                self.target, self._lower_streak = snapped, 0
        return self.target

    def efficient_size(self) -> int:
        """The smallest batch with (nearly) the best throughput: a larger one adds only latency."""
        throughput = {b: self.service.throughput(b) for b in range(1, self.max_batch_size + 1)}
        best = max(throughput.values())
        return next(b for b, images_s in throughput.items() if images_s >= EFFICIENT_SHARE * best)

    def size_now(self, now: float) -> int:
        waiting = self.waiting
        target = self._update_target(now)
        if waiting < min(target, self.max_batch_size) and not self.queues.any_due(now):
            return 0  # the batch that keeps up is coming, inside every waiting frame's window
        size = max(self.fit(waiting), min(target, waiting))  # at least the batch waited for
        if self.service.fitted:
            # with a backlog, batches past the efficient size gain no throughput (a CPU) and
            # hold every frame in them for longer; until t(b) is fitted, large batches teach it
            size = min(size, max(self.efficient_size(), target))
        return size

    def wake_at(self, now: float) -> float | None:
        deadline = self.queues.earliest_dispatch_by()
        rate = self.queues.arrival_rate(now)
        if 0 < rate < math.inf:  # a backlog: the next frames come when they come
            expected = now + (self.target - self.waiting) / rate
            deadline = expected if deadline is None else min(deadline, expected)
        return deadline


def build_policy(options: Options, shared: SharedSettings) -> AdaptivePolicy[Any]:
    return AdaptivePolicy(target_utilisation=options.target_utilisation, **shared.base_arguments())
