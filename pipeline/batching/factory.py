"""Build a policy by name: the daemon (from the config) and the simulator (from a sweep) use it.

The name picks the policy's module (:mod:`pipeline.batching.policies`); its own settings come
as ``options`` and are validated by that module's ``Options``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from pipeline.batching.policies import (
    BatchPolicy,
    PolicyOptions,
    SharedSettings,
    policy_module,
    policy_settings,
)
from pipeline.batching.queues import CameraRules, FrameQueues, queue_bound
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
    options: PolicyOptions | Mapping[str, Any] | None = None,
) -> BatchPolicy[Any]:
    """A fresh policy with its own queues; ``max_wait_ms`` is the timeout of timeout-style ones.

    ``options``: the policy's own settings (``{"latency_target_ms": 300}`` for ``aimd``), or
    its module's validated ``Options`` (``config.batching.policy_options``); unset: defaults.
    A setting the policy does not have is a ValueError naming the policy.
    """
    module = policy_module(name)  # ValueError: unknown batching policy ... (known: ...)
    queues: FrameQueues[Any] = FrameQueues(
        # cameras are made room for as they are read (FrameQueues.make_room)
        max_waiting=queue_bound(max_batch_size, 0, max_queue_frames),
        default_rules=default_rules or CameraRules(max_wait_ms=max_wait_ms),
        rules=camera_rules,
    )
    shared = SharedSettings(
        queues=queues,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        preferred_batch_sizes=preferred_batch_sizes,
        service=service,
    )
    return module.build_policy(policy_options(name, options), shared)


def policy_options(name: str, options: PolicyOptions | Mapping[str, Any] | None) -> PolicyOptions:
    """The policy's ``Options``, validated; ValueError names the policy and the setting."""
    model: type[PolicyOptions] = policy_module(name).Options
    if isinstance(options, PolicyOptions):
        if not isinstance(options, model):
            raise ValueError(f"options for the {options.name} policy given to the {name} policy")
        return options
    settings = dict(options or {})
    own = policy_settings(name)
    foreign = sorted(key for key in settings if key not in own)
    if foreign:
        has = f"its settings: {', '.join(own)}" if own else "it has none"
        raise ValueError(
            f"the {name} batching policy has no setting {', '.join(map(repr, foreign))} ({has})"
        )
    try:
        return model.model_validate({**settings, "name": name})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors()
        )
        raise ValueError(f"the {name} batching policy: {problems}") from None
