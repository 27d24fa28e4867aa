"""Batch formation: per-camera queues plus pluggable dispatch policies (pure, clock-driven)."""

from pipeline.batching.factory import make_policy
from pipeline.batching.policies import (
    POLICIES,
    AdaptivePolicy,
    AimdPolicy,
    Batch1Policy,
    BatchPolicy,
    Decision,
    StaticPolicy,
    TimeoutPolicy,
)
from pipeline.batching.queues import CameraRules, Dropped, FrameQueues, Queued
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
    "Queued",
    "ServiceModel",
    "StaticPolicy",
    "TimeoutPolicy",
    "make_policy",
]
