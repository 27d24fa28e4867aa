"""Reading detections and analytics events back: the Python API behind ``framebatch consume``.

>>> consumer = DetectionConsumer(redis.Redis(), StreamKeys("fb"), from_start=True)
>>> for message in consumer.messages(count=10):
...     print(message.camera, message.seq, len(message.detections))
>>> for event in EventConsumer(redis.Redis(), StreamKeys("fb")).messages(count=10):
...     print(event.camera, event.kind, event.track_id, event.region)
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from streams.groups import ensure_group
from streams.keys import StreamKeys
from streams.messages import DetectionMessage, Fields
from streams.object_events import ObjectEvent
from streams.redis_cluster import GroupsMissing, StreamPolls, read_streams
from streams.redis_errors import is_nogroup

DEFAULT_BLOCK_MS = 500
TRACKED_SESSIONS = 10_000  # decoder sessions remembered for de-duplication
DISCOVER_EVERY_S = 1.0  # how often to look for cameras that appeared since (all-cameras mode)


@dataclass(frozen=True)
class StreamKind:
    """A kind of per-camera stream a consumer reads: its keys, its messages, and where a
    message stands in its decoder session (repeats stand no further on than the last)."""

    stream: Callable[[StreamKeys, str], str]
    pattern: Callable[[StreamKeys], str]
    parse: Callable[[Fields], Any]
    position: Callable[[Any], tuple[int, ...]]


DETECTIONS = StreamKind(
    StreamKeys.detections,
    StreamKeys.detections_pattern,
    DetectionMessage.from_fields,
    lambda message: (message.seq,),
)
OBJECT_EVENTS = StreamKind(
    StreamKeys.object_events,
    StreamKeys.object_events_pattern,
    ObjectEvent.from_fields,
    lambda event: (event.seq, event.index),
)


class DetectionConsumer:
    """Iterates detection messages of some or all cameras (:class:`EventConsumer`: their
    analytics events, the same way).

    Without ``group`` it reads like ``XREAD`` (nothing is acknowledged; ``from_start`` replays
    what the streams still hold).  With ``group`` it joins a durable consumer group and
    acknowledges each message once the caller has taken the next one, so a message being
    handled when the process dies is delivered again.

    Give it a client from :func:`streams.redis_connect.connect` to ride out Redis outages;
    after a restart that lost the group, it joins again.

    Delivery from the pipeline is at least once: a frame whose detections were published just
    before a crash is published again after it.  With ``dedupe`` (the default) such a repeat
    is skipped (and still acknowledged): results of one decoder session come in ``seq``
    order, so a message whose ``seq`` is not above the last one of its session was delivered
    already.  ``duplicates`` counts what was skipped.
    """

    kind = DETECTIONS

    def __init__(
        self,
        redis_client: redis.Redis,
        keys: StreamKeys,
        *,
        cameras: Sequence[str] = (),
        from_start: bool = False,
        group: str | None = None,
        consumer: str | None = None,
        block_ms: int = DEFAULT_BLOCK_MS,
        dedupe: bool = True,
    ):
        self._redis = redis_client
        self._keys = keys
        self._fixed_cameras = tuple(cameras)
        self._from_start = from_start
        self._group = group
        self._consumer = consumer or f"consume-{os.getpid()}"
        self._block_ms = block_ms
        self._positions: dict[str, str] = {}
        self._polls = StreamPolls()  # on a cluster: which streams to ask, each time
        self._discovered_at: float | None = None
        self._dedupe = dedupe
        # (camera, session) -> furthest position delivered, least recently seen first
        self._last_seq: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()
        self.duplicates = 0

    def _is_duplicate(self, message: Any) -> bool:
        if not self._dedupe or not message.session:
            return False
        session = (message.camera, message.session)
        last = self._last_seq.get(session)
        position = self.kind.position(message)
        if last is not None and position <= last:
            self.duplicates += 1
            return True
        self._last_seq[session] = position
        self._last_seq.move_to_end(session)
        if len(self._last_seq) > TRACKED_SESSIONS:
            self._last_seq.popitem(last=False)
        return False

    def _discover(self, first: bool) -> None:
        """Add streams not yet followed (all cameras: found by SCAN, so late cameras join)."""
        if self._fixed_cameras:
            keys = [self.kind.stream(self._keys, c) for c in self._fixed_cameras]
        else:
            pattern = self.kind.pattern(self._keys)
            keys = [k.decode() for k in self._redis.scan_iter(match=pattern)]
        for key in keys:
            if key in self._positions:
                continue
            if self._group is not None:
                start = "0" if self._from_start or not first else "$"
                ensure_group(self._redis, key, self._group, start=start)
                self._positions[key] = ">"
            elif self._from_start or not first:
                self._positions[key] = (
                    "0"  # a stream that appeared after we started: all of it is new
                )
            else:
                last = self._redis.xrevrange(key, count=1)
                self._positions[key] = last[0][0].decode() if last else "0"

    def messages(
        self, *, count: int | None = None, timeout_s: float | None = None
    ) -> Iterator[Any]:
        """Messages as they arrive; stops after ``count`` or ``timeout_s`` without a new one."""
        delivered = 0
        last_activity = time.monotonic()
        while count is None or delivered < count:
            now = time.monotonic()
            if timeout_s is not None and now - last_activity >= timeout_s:
                return
            if self._discovered_at is None or now - self._discovered_at >= DISCOVER_EVERY_S:
                # busy streams must not hide a camera that starts later
                self._discover(first=self._discovered_at is None)
                self._discovered_at = now
            block = (
                self._block_ms
                if timeout_s is None
                else max(1, min(self._block_ms, int(timeout_s * 1000)))
            )
            reply = self._read(block) if self._positions else None
            if not reply:
                if not self._positions:
                    time.sleep(block / 1000)
                continue
            last_activity = time.monotonic()
            for key, entries in reply:
                key = key.decode()
                for entry_id, fields in entries:
                    if self._group is None:
                        self._positions[key] = entry_id.decode()
                    message = self.kind.parse(fields)
                    duplicate = self._is_duplicate(message)
                    if not duplicate:
                        yield message
                    if self._group is not None:
                        self._redis.xack(key, self._group, entry_id)
                    if duplicate:
                        continue
                    delivered += 1
                    if count is not None and delivered >= count:
                        return

    def _read(self, block_ms: int) -> list:
        try:
            return read_streams(
                self._redis,
                self._positions,
                group=self._group,
                consumer=self._consumer,
                block_ms=block_ms,
                polls=self._polls,
            )
        except GroupsMissing as exc:  # a cluster node lost its data; the others' reads came
            for key in exc.keys:
                self._positions.pop(key, None)
            self._discover(first=False)
            return exc.reply
        except redis.ResponseError as exc:
            if not is_nogroup(exc):
                raise
            # Redis restarted without its data: join again from the start of what it has now
            self._positions.clear()
            self._discover(first=False)
            return []


class EventConsumer(DetectionConsumer):
    """Iterates analytics events (:class:`~streams.object_events.ObjectEvent`) of some or
    all cameras.  Within a decoder session events come in (seq, index) order, so a repeat
    (an event written again, with the same ``id``) is skipped as a detection's is."""

    kind = OBJECT_EVENTS
