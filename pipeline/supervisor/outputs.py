"""The outputs of a run (``outputs:`` in the config): the relay that delivers every camera's
analytics events to MQTT brokers and webhooks, as a part the supervisor starts and stops."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import redis

from pipeline.errors import BadInput
from pipeline.supervisor.part import Part
from streams.keys import StreamKeys
from streams.outputs.base import OutputError, OutputOptions
from streams.outputs.relay import OutputRelay, OutputStats
from streams.urls import redact_url

log = logging.getLogger(__name__)

#: How long the stop waits for a delivery in flight (it is acknowledged if it ends in time;
#: else it is delivered again by the next run: at least once).
STOP_TIMEOUT_S = 5.0
MIN_REDIS_MAJOR = 7


class OutputsPart(Part):
    """Opens the outputs at once (a broker that refuses the password is bad input at start:
    ``BadInput``, exit 2); their threads run from ``start()`` to ``stop()``.  An output or
    Redis away never raises into the run: the relay counts and logs it (``stats()``)."""

    def __init__(
        self,
        outputs: Sequence[OutputOptions],
        *,
        client: redis.Redis,
        keys: StreamKeys,
        cameras: Callable[[], Iterable[str]],
        redis_kept: bool = True,
        fail_fast: redis.Redis | None = None,
    ):
        """``redis_kept``: Redis outlives the run (``redis.url``); else it is the run's private
        one, and what the outputs did not deliver is lost with it (said at stop).
        ``fail_fast``: a client that does not wait out outages, for counting what waits."""
        self._redis_kept = redis_kept
        if outputs:
            _check_redis_version(client)
        self._stopped = False
        try:
            self._relay = OutputRelay(
                outputs, redis_client=client, keys=keys, cameras=cameras, fail_fast=fail_fast
            )
        except OutputError as exc:
            raise BadInput(redact_url(str(exc))) from None

    def start(self) -> None:
        self._relay.start()

    def stop(self) -> None:
        """Legal in every state, more than once (also the exit stack's close).  Says, per
        output, the events it leaves undelivered."""
        self._relay.stop(STOP_TIMEOUT_S)
        if self._stopped:
            return
        self._stopped = True
        for stats in self._relay.count_waiting().values():
            waiting = stats.backlog + stats.pending
            if not waiting:
                continue
            fate = (
                "they wait in Redis for the next run of this output"
                if self._redis_kept
                else "they are lost with this run's private Redis (set redis.url to keep them)"
            )
            log.warning(
                "output %r: %d events not delivered at stop (%d unread, %d read and not "
                "acknowledged; %s): %s",
                stats.name,
                waiting,
                stats.backlog,
                stats.pending,
                stats.last_error or "no error",
                fate,
            )

    def stats(self) -> dict[str, OutputStats]:
        """Each output's counts now: delivered, dropped by cause, backlog, last error."""
        return self._relay.stats()


def _check_redis_version(client: redis.Redis) -> None:
    """The relay counts trimmed events with Redis 7's stream counters: an older server is bad
    input at start, not a relay that fails at every poll."""
    info = client.info("server")
    if "redis_version" not in info:  # a cluster client: one answer per node
        info = next(iter(info.values()), {})
    found = str(info.get("redis_version", "0"))
    if int(found.split(".")[0]) < MIN_REDIS_MAJOR:
        raise BadInput(
            f"outputs need Redis {MIN_REDIS_MAJOR}.0 or later (stream entries-read counters, "
            f"XAUTOCLAIM's deleted entries); this Redis is {found}"
        )
