"""Batch formation: per-camera queues plus pluggable dispatch policies (pure, clock-driven;
one module per policy in :mod:`pipeline.batching.policies`)."""

from pipeline.batching.factory import make_policy
from pipeline.batching.policies import (
    POLICIES,
    AdaptivePolicy,
    AimdPolicy,
    Batch1Policy,
    BatchPolicy,
    Decision,
    PolicyOptions,
    StaticPolicy,
    TimeoutPolicy,
    policy_names,
)
from pipeline.batching.queues import CameraRules, Dropped, FrameQueues, Queued, queue_bound
from pipeline.batching.service import ServiceModel

__all__ = [
    "POLICIES",
    "AdaptivePolicy",
    "AimdPolicy",
    "Batch1Policy",
    "BatchPolicy",
    "CameraRules",
    "Decision",
    "Dropped",
    "FrameQueues",
    "PolicyOptions",
    "Queued",
    "ServiceModel",
    "StaticPolicy",
    "TimeoutPolicy",
    "make_policy",
    "policy_names",
    "queue_bound",
]
