"""Status events (camera opened, error, reconnecting, ended) as a bounded Redis stream."""

from __future__ import annotations

import logging
import time

import redis

from streams.keys import StreamKeys
from streams.redis_errors import OUTAGE_ERRORS

log = logging.getLogger(__name__)

EVENTS_MAXLEN = 10_000


class EventLog:
    """Errors travel as data: each event is an entry in ``<prefix>:events``."""

    def __init__(self, redis_client: redis.Redis, keys: StreamKeys):
        self._redis = redis_client
        self._key = keys.events()

    def emit(self, camera: str, event: str, message: str = "", **details: str | int) -> None:
        """Best effort: an event that cannot reach Redis is logged here instead (a status
        message must never stop a decoder while Redis is away).  ``details``: fields for
        programs (``ended`` carries ``reason`` and ``frames``), beside the message for people."""
        fields = {"camera": camera, "event": event, "message": message, "time": repr(time.time())}
        fields.update({name: str(value) for name, value in details.items()})
        try:
            self._redis.xadd(self._key, fields, maxlen=EVENTS_MAXLEN, approximate=True)
        except OUTAGE_ERRORS as exc:
            log.warning("camera %s: %s %s (event not in Redis: %s)", camera, event, message, exc)

    def emit_each(self, events: list[tuple[str, str, str]]) -> None:
        """``(camera, event, message)`` events in one round trip, best effort as ``emit``."""
        if not events:
            return
        pipe = self._redis.pipeline(transaction=False)
        for camera, event, message in events:
            fields = {"camera": camera, "event": event, "message": message}
            pipe.xadd(
                self._key,
                {**fields, "time": repr(time.time())},
                maxlen=EVENTS_MAXLEN,
                approximate=True,
            )
        try:
            pipe.execute()
        except OUTAGE_ERRORS as exc:
            log.warning("%d events not in Redis: %s", len(events), exc)

    def last_id(self) -> str:
        """The newest event's id (``"0"`` when none): read after it to see only new events."""
        newest = self._redis.xrevrange(self._key, count=1)
        return newest[0][0].decode() if newest else "0"

    def read_after(
        self, last_id: str, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Events newer than ``last_id`` (``"0"`` for all), decoded to text."""
        reply = self._redis.xread({self._key: last_id}, block=block_ms)
        events: list[tuple[str, dict[str, str]]] = []
        for _key, entries in reply or []:
            for entry_id, fields in entries:
                decoded = {k.decode(): v.decode() for k, v in fields.items()}
                events.append((entry_id.decode(), decoded))
        return events
