"""What travels between the stages: frames waiting in the policy, prepared and inferred batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import BatchOutput
from pipeline.batching import Queued
from streams.messages import FrameMessage


@dataclass(frozen=True)
class PendingFrame:
    """A frame read from its stream, waiting in the batching policy."""

    entry_id: bytes
    message: FrameMessage
    image: np.ndarray | None = None  # pixels already out of their transport (shm), if any


@dataclass(frozen=True)
class PreparedBatch:
    """The reader's output: frames and the detector's input tensor."""

    batch_id: int  # 0, 1, 2, ... in the order the reader dispatched them
    frames: list[Queued[PendingFrame]]
    tensor: Any
    batched: float  # wall-clock time the policy dispatched it
    #: cameras whose first frames on this worker (since it took them) are in this batch
    fresh: frozenset[str] = frozenset()


@dataclass(frozen=True)
class InferredBatch:
    """The inferer's output: the detector's output for a prepared batch."""

    prepared: PreparedBatch
    output: BatchOutput
    inferred: float
