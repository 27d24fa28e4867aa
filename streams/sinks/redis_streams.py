"""Detections into Redis Streams, ``<prefix>:detections:<camera>`` (capped at
``redis.detections_maxlen``): the sink every run has unless ``sinks:`` says otherwise, and the one
``framebatch consume`` and :class:`streams.consumer.DetectionConsumer` read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from streams.messages import DetectionMessage
from streams.sinks.base import SinkContext, SinkOptions


class Options(SinkOptions):
    kind: Literal["redis_streams"] = "redis_streams"


class RedisStreamsSink:
    name = "redis_streams"

    def __init__(self, context: SinkContext):
        self._redis = context.redis_client
        self._keys = context.keys
        self._maxlen = context.detections_maxlen

    def write(self, messages: Sequence[DetectionMessage]) -> None:
        # one MULTI/EXEC round trip: all of a batch or none of it (a write Redis refuses at
        # queueing, out of memory say, aborts the rest)
        pipe = self._redis.pipeline(transaction=True)
        for message in messages:
            pipe.xadd(
                self._keys.detections(message.camera),
                message.to_fields(),
                maxlen=self._maxlen,
                approximate=True,
            )
        pipe.execute()

    def close(self) -> None:
        pass  # the client belongs to the daemon


def open_sink(options: Options, context: SinkContext) -> RedisStreamsSink:
    return RedisStreamsSink(context)
