"""Batch formation policy: a pure object (no Redis, no threads, an explicit clock).

Frames queue per camera.  A batch is dispatched when ``max_batch_size`` frames wait or when the
oldest waiting frame has waited ``max_wait_s``.  Never lockstep: a camera with nothing waiting is
simply left out.  A batch takes frames round-robin across cameras, oldest head first, and always
from the head of a camera's queue, so each camera's order is preserved and no single camera
fills a batch while others wait.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Queued(Generic[T]):
    camera: str
    arrived: float  # clock time when the batcher received the frame
    item: T


class TimeoutBatchPolicy(Generic[T]):
    """Max batch size + max wait: DeepStream's ``batched-push-timeout``, Triton's queue delay."""

    def __init__(self, *, max_batch_size: int, max_wait_s: float):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_s must be >= 0")
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._queues: dict[str, deque[Queued[T]]] = {}
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Frames queued and not yet dispatched."""
        return self._waiting

    def add(self, camera: str, item: T, now: float) -> None:
        self._queues.setdefault(camera, deque()).append(Queued(camera, now, item))
        self._waiting += 1

    def _oldest_arrival(self) -> float | None:
        heads = [queue[0].arrived for queue in self._queues.values() if queue]
        return min(heads) if heads else None

    def next_deadline(self) -> float | None:
        """Clock time at which the oldest waiting frame's window closes (None when idle)."""
        oldest = self._oldest_arrival()
        return None if oldest is None else oldest + self.max_wait_s

    def ready(self, now: float) -> bool:
        """Whether a batch should be dispatched at ``now``."""
        if self._waiting >= self.max_batch_size:
            return True
        deadline = self.next_deadline()
        return deadline is not None and now >= deadline

    def take(self) -> list[Queued[T]]:
        """Remove and return up to ``max_batch_size`` frames, round-robin over cameras."""
        batch: list[Queued[T]] = []
        while len(batch) < self.max_batch_size and self._waiting:
            # one frame per camera per round, cameras with the oldest head first
            heads = sorted((q for q in self._queues.values() if q), key=lambda q: q[0].arrived)
            for queue in heads[: self.max_batch_size - len(batch)]:
                batch.append(queue.popleft())
                self._waiting -= 1
        return batch

    def drain(self) -> Iterable[list[Queued[T]]]:
        """Every waiting frame, in batches (used to flush at the end of a replay)."""
        while self._waiting:
            yield self.take()
