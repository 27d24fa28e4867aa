"""``aimd``: like ``timeout`` (its timeout is ``batching.max_wait_ms``), with a batch cap that
grows by one while batches meet ``latency_target_ms`` and shrinks by a factor when one misses
it (Clipper's additive increase / multiplicative decrease)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.batching.policies.base import PolicyOptions, SharedSettings, T
from pipeline.batching.policies.timeout import TimeoutPolicy


class Options(PolicyOptions):
    name: Literal["aimd"] = Field("aimd", description="The policy these settings are for")
    latency_target_ms: float = Field(
        200.0,
        gt=0,
        allow_inf_nan=False,
        description="aimd: the latency its steps aim at (a batch's service time), in ms",
    )


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


def build_policy(options: Options, shared: SharedSettings) -> AimdPolicy[Any]:
    return AimdPolicy(
        timeout_s=shared.max_wait_ms / 1000,
        latency_target_s=options.latency_target_ms / 1000,
        **shared.base_arguments(),
    )
