"""Build a policy by name: the daemon (from the config) and the simulator (from a sweep) use it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.batching.policies import POLICIES, BatchPolicy
from pipeline.batching.queues import CameraRules, FrameQueues
from pipeline.batching.service import ServiceModel


def make_policy(
    name: str,
    *,
    max_batch_size: int,
    max_wait_ms: float,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_frames: int | None = None,
    default_rules: CameraRules | None = None,
    camera_rules: Mapping[str, CameraRules] | None = None,
    service: ServiceModel | None = None,
    target_utilisation: float = 0.85,
    latency_target_ms: float = 200.0,
) -> BatchPolicy[Any]:
    """A fresh policy with its own queues; ``max_wait_ms`` is the timeout of timeout-style ones."""
    try:
        policy_class = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown batching policy {name!r} (known: {', '.join(POLICIES)})"
        ) from None
    queues: FrameQueues[Any] = FrameQueues(
        max_waiting=max_queue_frames or 4 * max_batch_size,
        default_rules=default_rules or CameraRules(max_wait_ms=max_wait_ms),
        rules=camera_rules,
    )
    common: dict[str, Any] = dict(
        queues=queues,
        max_batch_size=max_batch_size,
        preferred_batch_sizes=preferred_batch_sizes,
        service=service,
    )
    if name == "timeout":
        return policy_class(timeout_s=max_wait_ms / 1000, **common)
    if name == "aimd":
        return policy_class(
            timeout_s=max_wait_ms / 1000, latency_target_s=latency_target_ms / 1000, **common
        )
    if name == "adaptive":
        return policy_class(target_utilisation=target_utilisation, **common)
    return policy_class(**common)
