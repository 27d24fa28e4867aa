"""What a Redis error means, for the clients in ``streams.redis_connect`` and
``streams.redis_cluster`` alike: an outage to wait out, or a lost consumer group.

This module imports neither of them, so both can build on it: ``redis_connect`` builds its
clients on ``redis_cluster`` for a cluster, and both classify errors here.
"""

from __future__ import annotations

import socket

import redis

OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError, socket.timeout)
# ConnectionError subclasses that no waiting mends: wrong credentials
_REFUSALS = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


def is_outage(error: BaseException) -> bool:
    """Redis is unreachable (down, restarting, loading), as opposed to refusing us."""
    return isinstance(error, OUTAGE_ERRORS) and not isinstance(error, _REFUSALS)


def is_nogroup(error: BaseException) -> bool:
    """Redis lost a consumer group: it restarted without persistence (or someone deleted it)."""
    return isinstance(error, redis.ResponseError) and str(error).startswith("NOGROUP")
