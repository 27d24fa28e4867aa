"""What every batch worker of a run shares, in one object instead of a relay of arguments."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.telemetry import NO_TELEMETRY, Telemetry
from streams.keys import StreamKeys


@dataclass(frozen=True)
class WorkerContext:
    """Where a batch worker's frames and results live, how they are counted and acknowledged,
    who hears of them, and its name in the frames group.

    One per worker: ``consumer`` is the worker's own (``batcher-N``, or a detector worker's
    id, which also holds its camera leases, so ``acks`` fences position writes by it)."""

    redis: redis.Redis
    keys: StreamKeys
    accounting: Accounting
    acks: FrameAcks
    telemetry: Telemetry = NO_TELEMETRY
    clock: Callable[[], float] = time.time
    consumer: str = "batcher-0"
