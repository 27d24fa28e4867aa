"""When to dispatch a batch, and how big: one module per policy, all over the same
:class:`~pipeline.batching.queues.FrameQueues` (the shared mechanics are in :mod:`.base`).

* ``batch1`` — every frame alone (no batching; the latency floor at low load).
* ``static`` — wait for a full batch (throughput at any latency cost).
* ``timeout`` — full batch or ``max_wait_ms`` after the oldest frame.
* ``aimd`` — ``timeout`` with a batch cap stepped against ``latency_target_ms`` (Clipper).
* ``adaptive`` (default) — dispatch at once unless the detector cannot keep up at this batch
  size; then wait for the smallest batch that keeps up at ``target_utilisation``.

Adding a policy is one new module here, named as the policy, that defines

* ``Options``: a :class:`~.base.PolicyOptions` whose ``name`` is ``Literal["<module name>"]``,
  holding the policy's own settings (default, bounds and a description each).  The config
  takes them beside ``batching.policy``; ``make_policy`` takes them as ``options``;
* a :class:`~.base.BatchPolicy` subclass whose ``name`` is the module's name;
* ``build_policy(options, shared) -> BatchPolicy``: the policy made from its options and the
  :class:`~.base.SharedSettings` (queues, batch sizes, service model, ``max_wait_ms``).

The policy names the config accepts and ``make_policy`` builds are derived from these modules.
"""

from __future__ import annotations

import functools
from types import ModuleType

from pipeline.batching.policies.adaptive import AdaptivePolicy
from pipeline.batching.policies.aimd import AimdPolicy
from pipeline.batching.policies.base import (
    BatchPolicy,
    Decision,
    PolicyOptions,
    SharedSettings,
)
from pipeline.batching.policies.batch1 import Batch1Policy
from pipeline.batching.policies.static import StaticPolicy
from pipeline.batching.policies.timeout import TimeoutPolicy
from streams.registry import kind_modules

_NOT_POLICIES = frozenset({"base"})
DEFAULT_POLICY = "adaptive"


@functools.cache
def policy_modules() -> dict[str, ModuleType]:
    """Every policy module of this package, by policy name."""
    modules = kind_modules(
        __name__, __path__, skip=_NOT_POLICIES, field="name", entry="build_policy"
    )
    for name, module in modules.items():
        if len(_classes_named(module, name)) != 1:
            raise TypeError(f"{module.__name__} must define one BatchPolicy named {name!r}")
    return modules


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(policy_modules()))


def policy_module(name: str) -> ModuleType:
    """The module of the policy called ``name``; ValueError lists the known ones."""
    try:
        return policy_modules()[name]
    except KeyError:
        known = ", ".join(policy_names())
        raise ValueError(f"unknown batching policy {name!r} (known: {known})") from None


def policy_options_models() -> dict[str, type[PolicyOptions]]:
    """Each policy's ``Options``, by policy name."""
    return {name: module.Options for name, module in policy_modules().items()}


def policy_settings(name: str) -> tuple[str, ...]:
    """The names of the policy's own settings (its ``Options`` fields but ``name``)."""
    return tuple(field for field in policy_module(name).Options.model_fields if field != "name")


def _classes_named(module: ModuleType, name: str) -> list[type[BatchPolicy]]:
    """The :class:`BatchPolicy` subclasses in ``module`` whose ``name`` is ``name``."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BatchPolicy) and value.name == name
    ]


#: Policy name -> class, one per module of this package.
POLICIES: dict[str, type[BatchPolicy]] = {
    name: _classes_named(module, name)[0] for name, module in policy_modules().items()
}

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "AdaptivePolicy",
    "AimdPolicy",
    "Batch1Policy",
    "BatchPolicy",
    "Decision",
    "PolicyOptions",
    "SharedSettings",
    "StaticPolicy",
    "TimeoutPolicy",
    "policy_module",
    "policy_modules",
    "policy_names",
    "policy_options_models",
    "policy_settings",
]
