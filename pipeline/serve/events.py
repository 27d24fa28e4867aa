"""The API's read side of analytics events: the latest events of the cameras, read from their
events streams in Redis (``<prefix>:events:{<camera>}``), and the snapshot files they name."""

from __future__ import annotations

import heapq
from collections.abc import Callable

import redis

from pipeline.analytics.snapshots import SnapshotStore
from streams.keys import StreamKeys
from streams.object_events import ObjectEvent

#: A kind filter reads this many times ``limit`` entries a camera at most, then stops looking.
_SCAN_FACTOR = 20


class EventLog:
    def __init__(
        self,
        redis_client: redis.Redis,
        keys: StreamKeys,
        *,
        cameras: Callable[[], list[str]],
        snapshots: SnapshotStore | None,
    ):
        """``cameras``: the run's cameras now (the camera API adds and removes some)."""
        self._redis = redis_client
        self._keys = keys
        self._cameras = cameras
        self._snapshots = snapshots

    def latest(
        self,
        *,
        camera: str | None = None,
        kind: str | None = None,
        limit: int = 50,
        per_camera: int | None = None,
    ) -> list[ObjectEvent]:
        """Newest first, of one camera or all (at most ``per_camera`` of each: a busy camera
        does not push a quiet one's out); events of a newer schema are left out."""
        cameras = [camera] if camera is not None else self._cameras()
        each = min(limit, per_camera or limit)
        count = each if kind is None else each * _SCAN_FACTOR
        found: list[ObjectEvent] = []
        for name in cameras:
            entries = self._redis.xrevrange(self._keys.object_events(name), count=count)
            events = []
            for _entry_id, fields in entries:
                try:
                    event = ObjectEvent.from_fields(fields)
                except ValueError:
                    continue
                if kind is None or event.kind == kind:
                    events.append(event)
                if len(events) == each:
                    break
            found += events
        return heapq.nlargest(limit, found, key=lambda e: (e.time, e.seq, e.index))

    def snapshot(self, event_id: str) -> bytes | None:
        """The event's JPEG, if one was taken and is still kept."""
        return None if self._snapshots is None else self._snapshots.read(event_id)
