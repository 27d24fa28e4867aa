"""The outputs of a run (``outputs:`` in the config): the relay that delivers every camera's
analytics events to MQTT brokers and webhooks, as a part the supervisor starts and stops."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import redis

from pipeline.errors import BadInput
from pipeline.supervisor.part import Part
from streams.keys import StreamKeys
from streams.outputs.base import OutputError, OutputOptions
from streams.outputs.relay import OutputRelay, OutputStats
from streams.urls import redact_url

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
    ):
        if outputs:
            _check_redis_version(client)
        try:
            self._relay = OutputRelay(outputs, redis_client=client, keys=keys, cameras=cameras)
        except OutputError as exc:
            raise BadInput(redact_url(str(exc))) from None

    def start(self) -> None:
        self._relay.start()

    def stop(self) -> None:
        """Legal in every state, more than once (also the exit stack's close)."""
        self._relay.stop(STOP_TIMEOUT_S)

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
