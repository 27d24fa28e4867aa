"""``static``: only full batches of ``max_batch_size`` (throughput at any latency cost)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.batching.policies.base import BatchPolicy, PolicyOptions, SharedSettings, T


class Options(PolicyOptions):
    name: Literal["static"] = Field("static", description="The policy these settings are for")


class StaticPolicy(BatchPolicy[T]):
    name = "static"

    def size_now(self, now: float) -> int:
        return self.max_batch_size if self.waiting >= self.max_batch_size else 0

    def wake_at(self, now: float) -> float | None:
        return None


def build_policy(options: Options, shared: SharedSettings) -> StaticPolicy[Any]:
    return StaticPolicy(**shared.base_arguments())
