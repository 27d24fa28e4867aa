"""What every batching policy shares: the :class:`BatchPolicy` mechanics over the
:class:`FrameQueues`, its :class:`Decision`, the base of each policy's ``Options`` and the
settings each one is built with.

A policy is a pure object driven by an explicit clock: the daemon and ``framebatch simulate``
call ``add`` for each arriving frame, ``poll(now, idle=...)`` whenever something may have
changed (``idle``: the detector can take a batch now), and ``observe`` with the service time of
each finished batch.  ``poll`` returns the batch to run (possibly empty), the frames dropped
before inference, and the time by which it wants to be polled again.  Subclasses decide only
``size_now`` (how many frames to send now, 0 = keep waiting) and ``wake_at``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from pipeline.batching.queues import Dropped, FrameQueues, Queued
from pipeline.batching.service import ServiceModel

T = TypeVar("T")


class PolicyOptions(BaseModel):
    """A policy's own settings: in the config they sit beside ``batching.policy``, in
    ``make_policy`` they are its ``options``.  ``name`` names the policy (the discriminator)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    name: str = Field(description="The policy these settings are for")


@dataclass(frozen=True)
class SharedSettings:
    """What every policy is built with besides its own options: its queues and the
    ``batching`` settings all policies share."""

    queues: FrameQueues[Any]
    max_batch_size: int
    max_wait_ms: float  # every frame's wait cap; the timeout of the timeout-style policies
    preferred_batch_sizes: Sequence[int] = ()
    service: ServiceModel | None = None

    def base_arguments(self) -> dict[str, Any]:
        """The keyword arguments :class:`BatchPolicy` itself takes."""
        return {
            "queues": self.queues,
            "max_batch_size": self.max_batch_size,
            "preferred_batch_sizes": self.preferred_batch_sizes,
            "service": self.service,
        }


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
