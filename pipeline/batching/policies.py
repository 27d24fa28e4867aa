"""When to dispatch a batch, and how big: the policies, all over the same :class:`FrameQueues`.

A policy is a pure object driven by an explicit clock: the daemon and ``framebatch simulate``
call ``add`` for each arriving frame, ``poll(now, idle=...)`` whenever something may have
changed (``idle``: the detector can take a batch now), and ``observe`` with the service time of
each finished batch.  ``poll`` returns the batch to run (possibly empty), the frames dropped
before inference, and the time by which it wants to be polled again.

* ``batch1`` — every frame alone (no batching; the latency floor at low load).
* ``static`` — wait for a full batch (throughput at any latency cost).
* ``timeout`` — full batch or ``max_wait_ms`` after the oldest frame (DeepStream's
  ``batched-push-timeout``, Triton's ``max_queue_delay_microseconds``).
* ``aimd`` — a step rule: the batch cap grows by one while batches meet the latency target and
  shrinks by a factor when one misses it (Clipper's AIMD).
* ``adaptive`` (default) — work-conserving: dispatch at once unless the measured arrival rate and
  the learned service time say the detector cannot keep up at this batch size; then wait for
  the smallest batch that keeps up, never past a frame's window (``max_wait_frames`` of its own
  camera's frame interval, capped by ``max_wait_ms``).  Scales up at once, down only after
  ``hold`` consecutive decisions (the stability guard), snapped to preferred sizes.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pipeline.batching.queues import Dropped, FrameQueues, Queued
from pipeline.batching.service import ServiceModel

T = TypeVar("T")

EFFICIENT_SHARE = 0.99  # a batch within 1 % of the best throughput is "efficient"


@dataclass(frozen=True)
class Decision(Generic[T]):
    batch: list[Queued[T]]
    dropped: list[Dropped[T]]
    wake_at: float | None  # poll again by then at the latest (None: on the next arrival)


class BatchPolicy(Generic[T]):
    """Shared mechanics; subclasses decide ``size_now`` (0 = keep waiting) and ``wake_at``."""

    name = "base"

    def __init__(
        self,
        *,
        queues: FrameQueues[T],
        max_batch_size: int,
        preferred_batch_sizes: Sequence[int] = (),
        service: ServiceModel | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.queues = queues
        self.max_batch_size = max_batch_size
        self.preferred = tuple(sorted(p for p in set(preferred_batch_sizes) if p <= max_batch_size))
        self.service = service or ServiceModel()

    @property
    def waiting(self) -> int:
        return self.queues.waiting

    def add(self, camera: str, seq: int, captured: float, item: T, now: float) -> list[Dropped[T]]:
        return self.queues.add(camera, seq, captured, item, now)

    def poll(self, now: float, *, idle: bool = True, start_delay_s: float = 0.0) -> Decision[T]:
        """``start_delay_s``: how long a batch dispatched now waits before it runs (the detector
        finishing the batch ahead of it, in a pipeline that prepares one batch ahead)."""
        if not self.waiting:
            return Decision([], [], None)
        size = self.size_now(now) if idle else 0
        start = now + start_delay_s  # when a batch sent now runs
        if size:  # no larger than the frames that can finish by their deadlines
            size = self.fresh_size(size, start)
        # what cannot finish in time is dropped: frames this batch would finish late, or, with
        # no batch now, frames that would be late even alone after the batch ahead of them
        dropped = self.queues.expire(start, self.service.estimate(max(size, 1)))
        # a guard: fresh_size left at least ``size`` frames in time, and only late ones drop
        size = min(size, self.waiting)
        if size <= 0:
            return Decision([], dropped, self.wake_at(now) if self.waiting else None)
        return Decision(self.queues.take(size), dropped, None)

    def observe(self, batch_size: int, seconds: float) -> None:
        self.service.observe(batch_size, seconds)

    def flush(self) -> list[list[Queued[T]]]:
        """Everything still waiting, in full batches (end of a replay)."""
        batches = []
        while self.waiting:
            batches.append(self.queues.take(self.max_batch_size))
        return batches

    def fresh_size(self, size: int, start: float) -> int:
        """The largest batch, up to ``size``, whose frames can all finish by their freshness
        deadlines when it starts at ``start``: at least that many waiting frames finish in time
        at its service time. Sizing the batch to the deadline, not the deadline to the batch: a
        busy detector's full batch can outlast a short deadline, and dropping every frame that
        would miss it starves the pipeline (0 frames out while all of them are late)."""
        if not self.queues.expires_before(start + self.service.estimate(size)):
            return size
        deadlines = self.queues.deadlines()  # sorted: one pass over the queues per dispatch
        for smaller in range(size, 0, -1):
            late = bisect_left(deadlines, start + self.service.estimate(smaller))
            if self.waiting - late >= smaller:
                return size if smaller == size else self.fit(smaller)
        return 0

    def fit(self, available: int) -> int:
        """The size to dispatch from ``available`` frames: the largest preferred size that fits,
        else all of them (up to the max)."""
        available = min(available, self.max_batch_size)
        fitting = [p for p in self.preferred if p <= available]
        return fitting[-1] if fitting else available

    def size_now(self, now: float) -> int:
        raise NotImplementedError

    def wake_at(self, now: float) -> float | None:
        return self.queues.earliest_dispatch_by()


class Batch1Policy(BatchPolicy[T]):
    name = "batch1"

    def fit(self, available: int) -> int:
        return min(available, 1)

    def size_now(self, now: float) -> int:
        return 1


class StaticPolicy(BatchPolicy[T]):
    name = "static"

    def size_now(self, now: float) -> int:
        return self.max_batch_size if self.waiting >= self.max_batch_size else 0

    def wake_at(self, now: float) -> float | None:
        return None


class TimeoutPolicy(BatchPolicy[T]):
    name = "timeout"

    def __init__(self, *, timeout_s: float, **kwargs):
        super().__init__(**kwargs)
        if timeout_s < 0:
            raise ValueError("timeout must be >= 0")
        self.timeout_s = timeout_s

    def size_now(self, now: float) -> int:
        oldest = self.queues.oldest_arrival()
        if self.waiting >= self.max_batch_size or (
            oldest is not None and now >= oldest + self.timeout_s
        ):
            return self.fit(self.waiting)
        return 0

    def wake_at(self, now: float) -> float | None:
        oldest = self.queues.oldest_arrival()
        return None if oldest is None else oldest + self.timeout_s


class AimdPolicy(TimeoutPolicy[T]):
    """Batch cap by additive increase / multiplicative decrease against a latency target."""

    name = "aimd"

    def __init__(self, *, latency_target_s: float, decrease: float = 0.7, **kwargs):
        super().__init__(**kwargs)
        self.latency_target_s = latency_target_s
        self.decrease = decrease
        self.cap = 1.0

    def size_now(self, now: float) -> int:
        oldest = self.queues.oldest_arrival()
        cap = max(1, int(self.cap))
        if self.waiting >= cap or (oldest is not None and now >= oldest + self.timeout_s):
            return min(self.waiting, cap)
        return 0

    def observe(self, batch_size: int, seconds: float) -> None:
        super().observe(batch_size, seconds)
        # the batch's own service time against the target, as Clipper does: counting queueing
        # delay would shrink the cap under overload, exactly when batching is needed most
        if seconds > self.latency_target_s:
            self.cap = max(1.0, self.cap * self.decrease)
        else:
            self.cap = min(float(self.max_batch_size), self.cap + 1)


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
        if rate == math.inf:
            # a file job's backlog: throughput is all that counts, and full batches never have
            # less of it (t(b) = a + c·b, a >= 0); the efficient size would follow a model fed
            # only the sizes it chose, which on a busy CPU can settle on batches of one
            raw = self.max_batch_size
        elif raw is None:  # nothing keeps up: the smallest batch with (nearly) the best throughput
            raw = self.efficient_size()
        # engine-friendly sizes, except at low load, where one frame alone keeps up
        snapped = raw if raw == 1 else next((p for p in self.preferred if p >= raw), raw)
        if snapped >= self.target:  # falling behind costs more than a larger batch: follow at once
            self.target, self._lower_streak = snapped, 0
        else:  # stability guard: shrink only when the lower target holds for a while
            self._lower_streak += 1
            if self._lower_streak >= self.hold:
                self.target, self._lower_streak = snapped, 0
        return self.target

    def efficient_size(self) -> int:
        """The smallest batch with (nearly) the best throughput: a larger one adds only latency."""
        best = self.service.throughput(self.max_batch_size)
        sizes = range(1, self.max_batch_size + 1)
        return next(b for b in sizes if self.service.throughput(b) >= EFFICIENT_SHARE * best)

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


POLICIES: dict[str, type[BatchPolicy]] = {
    policy.name: policy
    for policy in (Batch1Policy, StaticPolicy, TimeoutPolicy, AimdPolicy, AdaptivePolicy)
}
