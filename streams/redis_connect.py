"""Redis clients that ride out an outage: every command is retried, with backoff, until Redis
answers again or ``reconnect_timeout_s`` has passed since the first failure.

A retried write may have reached Redis before the connection broke, so a retry can repeat it:
delivery is at least once, and consumers de-duplicate by ``frame_id``.  Where waiting is wrong
(a live camera's frames should be shed while Redis is away, not queued), ``fail_fast`` gives a
client that does not retry: the caller counts what it sheds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from streams.redis_cluster import connect_cluster
from streams.redis_errors import OUTAGE_ERRORS, is_outage

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RECONNECT_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 30.0  # a silent peer (a partition) fails a read instead of hanging it
FAIL_FAST_CONNECT_TIMEOUT_S = 0.5
FAIL_FAST_SOCKET_TIMEOUT_S = 2.0  # a partitioned Redis must not stall a live camera for long


class OutageRetry(Retry):
    """redis-py's retry loop bounded by time, not by a count: a refused connection fails in
    microseconds and an unreachable host in ``CONNECT_TIMEOUT_S``, so counts mean nothing."""

    def __init__(self, timeout_s: float, *, clock: Callable[[], float] = time.monotonic):
        super().__init__(ExponentialBackoff(cap=1.0, base=0.05), retries=-1)
        self.timeout_s = timeout_s
        self._clock = clock

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        self._backoff.reset()
        failures, deadline = 0, None
        while True:
            try:
                result = do()
            except self._supported_errors as error:
                if not is_outage(error) or (is_retryable and not is_retryable(error)):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                now = self._clock()
                if deadline is None:
                    deadline = now + self.timeout_s
                    if self.timeout_s > 0:
                        log.warning(
                            "Redis unreachable (%s): retrying for up to %.0f s",
                            error,
                            self.timeout_s,
                        )
                if now >= deadline:
                    raise
                time.sleep(min(self._backoff.compute(failures), max(0.0, deadline - now)))
            else:
                if failures and self.timeout_s > 0:
                    log.warning("Redis answers again after %d failed attempts", failures)
                return result


def connect(
    url: str,
    *,
    reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
    fail_fast: bool = False,
    socket_timeout_s: float = SOCKET_TIMEOUT_S,
    cluster: bool = False,
) -> redis.Redis:
    """A client for ``url`` that retries through outages (or, ``fail_fast``, never retries).
    ``socket_timeout_s`` also bounds a TLS handshake with a server that speaks no TLS.
    ``cluster``: ``url`` is a node of a Redis Cluster (``streams.redis_cluster``)."""
    options: dict[str, Any] = {
        "socket_connect_timeout": FAIL_FAST_CONNECT_TIMEOUT_S if fail_fast else CONNECT_TIMEOUT_S,
        "socket_timeout": min(socket_timeout_s, FAIL_FAST_SOCKET_TIMEOUT_S)
        if fail_fast
        else socket_timeout_s,
    }
    if not url.startswith("unix:"):
        options["socket_keepalive"] = True
    if cluster:
        # a RedisCluster client is no redis.Redis, but answers every command framebatch uses
        return connect_cluster(  # type: ignore[return-value]
            url, reconnect_timeout_s=0.0 if fail_fast else reconnect_timeout_s, **options
        )
    return redis.Redis.from_url(
        url,
        retry=OutageRetry(0.0 if fail_fast else reconnect_timeout_s),
        retry_on_error=list(OUTAGE_ERRORS),
        **options,
    )
