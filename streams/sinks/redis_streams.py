"""Detections into Redis Streams, ``<prefix>:detections:{<camera>}`` (capped at
``redis.detections_maxlen``): the sink every run has unless ``sinks:`` says otherwise, and the one
``framebatch consume`` and :class:`streams.consumer.DetectionConsumer` read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from streams.messages import DetectionMessage
from streams.redis_cluster import SlotTransactions
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
        # queueing, out of memory say, aborts the rest).  On a Redis Cluster one pipeline, a
        # round trip per node: a refused write raises, the batch is not acknowledged and is
        # published again (consumers de-duplicate by frame_id)
        tx = SlotTransactions(self._redis, atomic=False)
        for message in messages:
            key = self._keys.detections(message.camera)
            tx.on(key).xadd(key, message.to_fields(), maxlen=self._maxlen, approximate=True)
        tx.execute()

    def close(self) -> None:
        pass  # the client belongs to the daemon


def open_sink(options: Options, context: SinkContext) -> RedisStreamsSink:
    return RedisStreamsSink(context)
