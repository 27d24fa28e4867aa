"""``batch1``: every frame alone, as soon as the detector is free (no batching; the latency
floor at low load)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.batching.policies.base import BatchPolicy, PolicyOptions, SharedSettings, T


class Options(PolicyOptions):
    name: Literal["batch1"] = Field("batch1", description="The policy these settings are for")


class Batch1Policy(BatchPolicy[T]):
    name = "batch1"

    def fit(self, available: int) -> int:
        return min(available, 1)

    def size_now(self, now: float) -> int:
        return 1


def build_policy(options: Options, shared: SharedSettings) -> Batch1Policy[Any]:
    return Batch1Policy(**shared.base_arguments())
