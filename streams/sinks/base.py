"""The ``DetectionSink`` port: where a batch's detection messages go before its frames are
acknowledged.

A sink's ``write`` returns only once the messages are as safe as that sink can make them, and
raises otherwise; the publisher acknowledges the frames after every sink has returned.  A crash
in between repeats messages (consumers de-duplicate by ``frame_id``), never loses one.  ``write``
may be called from several publisher threads at once (one per detector worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import redis
from pydantic import BaseModel, ConfigDict

from streams.keys import StreamKeys
from streams.messages import DetectionMessage


class SinkOptions(BaseModel):
    """A sink's settings in the config (``sinks:`` entries); ``kind`` names the sink."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    kind: str


@dataclass(frozen=True)
class SinkContext:
    """What the daemon hands every sink it opens."""

    redis_client: redis.Redis  # retries through Redis outages for redis.reconnect_timeout_s
    keys: StreamKeys
    detections_maxlen: int  # redis.detections_maxlen


class DetectionSink(Protocol):
    """Writes detection messages somewhere; thread-safe."""

    name: str

    def write(self, messages: Sequence[DetectionMessage]) -> None:
        """Durable (as far as this sink goes) when it returns; raises when not."""

    def close(self) -> None: ...


class SinkError(Exception):
    """A sink could not be opened (its file, its endpoint): bad input at start."""
