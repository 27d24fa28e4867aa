"""Decoder status events (opened, reconnecting, error, ended, crashed), relayed from Redis to
the camera states the API and the metrics show, and to the caller's ``on_event`` (the CLI logs
each one).  Every event of this run is relayed, whichever process decodes the camera."""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from pipeline.supervisor.part import Part
from pipeline.supervisor.services import Services
from streams.events import EventLog

log = logging.getLogger(__name__)


class EventRelay(Part):
    def __init__(self, services: Services, on_event: Callable[[dict[str, str]], None]):
        self._events = EventLog(services.client, services.keys)
        self._states = services.states
        self._on_event = on_event
        self._last = self._events.last_id()  # events before this run are not this run's

    def tick(self) -> None:
        for event_id, event in self._events.read_after(self._last):
            self._last = event_id
            self._states.on_event(event)
            self._on_event(event)

    def stop(self) -> None:
        """What came before the stop is still relayed (unless Redis is away: the run is
        ending anyway, and the parts after this one must still stop)."""
        try:
            self.tick()
        except redis.RedisError as exc:
            log.warning("decoder events not relayed while stopping: %s", exc)
