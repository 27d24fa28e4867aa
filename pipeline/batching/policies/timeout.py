"""``timeout``: a full batch, or whatever is waiting ``max_wait_ms`` after the oldest frame
(DeepStream's ``batched-push-timeout``, Triton's ``max_queue_delay_microseconds``).  Its
timeout is the shared ``batching.max_wait_ms``; it has no settings of its own."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.batching.policies.base import BatchPolicy, PolicyOptions, SharedSettings, T


class Options(PolicyOptions):
    name: Literal["timeout"] = Field("timeout", description="The policy these settings are for")


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


def build_policy(options: Options, shared: SharedSettings) -> TimeoutPolicy[Any]:
    return TimeoutPolicy(timeout_s=shared.max_wait_ms / 1000, **shared.base_arguments())
