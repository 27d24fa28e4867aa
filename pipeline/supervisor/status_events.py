"""Decoder status events (opened, reconnecting, error, ended, crashed), relayed from Redis to
the camera states the API and the metrics show, and to the caller's ``on_event`` (the CLI logs
each one).  Every event of this run is relayed, whichever process decodes the camera."""

from __future__ import annotations

from collections.abc import Callable

import redis

from pipeline.serve.control import CameraStates
from pipeline.supervisor.part import Part
from streams.events import EventLog
from streams.keys import StreamKeys


class EventRelay(Part):
    def __init__(
        self,
        redis_client: redis.Redis,
        keys: StreamKeys,
        states: CameraStates,
        on_event: Callable[[dict[str, str]], None],
    ):
        self._events = EventLog(redis_client, keys)
        self._states = states
        self._on_event = on_event
        self._last = self._events.last_id()  # events before this run are not this run's

    def tick(self) -> None:
        for event_id, event in self._events.read_after(self._last):
            self._last = event_id
            self._states.on_event(event)
            self._on_event(event)

    def stop(self) -> None:
        """What came before the stop is still relayed."""
        self.tick()
