"""Redis access checked once at start, and Redis errors told as one line that says what to do.

An ACL user that lacks one command, or may touch only other keys, would otherwise fail deep in a
decoder or the batcher with a traceback.  ``check_access`` runs every command a role uses on a
throw-away key under the prefix, so a denial is found before anything starts and names the
command.  ``docs/operations.md`` lists the minimal ACL per role.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import key_slot

from streams.keys import StreamKeys
from streams.redis_cluster import NotACluster, refuses_as_cluster
from streams.urls import redact_url, url_scheme

PROBE_GROUP = "framebatch-probe"
_PROBE_SUFFIXES = ("", ":hash", ":workers", ":lease", ":cursor")
#: the camera registry's probe keys (``pipeline.fleet.registry.registry_probes``)
_PROBE_SUFFIXES += tuple(
    ":registry" + part for part in ("", ":versions", ":removing", ":version", ":stopped")
)

#: a decoder's fence's (``streams.fence.fence_probes``: a camera "probe" under the probe key)
_PROBE_SUFFIXES += tuple(
    f":{kind}:{{probe}}" for kind in ("decode-lease", "frames", "progress", "decoded")
)


class RedisAccessError(RuntimeError):
    """Redis cannot be used as configured; the message is one line that names the cause."""


def _daemon_probes(client: redis.Redis, key: str) -> list[tuple[str, Callable[[], Any]]]:
    """(command, call) for every command the daemon, its decoders and batchers use."""
    return [
        ("PING", client.ping),
        ("TIME", client.time),
        ("XADD", lambda: client.xadd(key, {"probe": 1}, maxlen=10, approximate=True)),
        ("XLEN", lambda: client.xlen(key)),
        ("XRANGE", lambda: client.xrange(key, count=1)),
        ("XREVRANGE", lambda: client.xrevrange(key, count=1)),
        ("XREAD", lambda: client.xread({key: "0"}, count=1)),
        ("XGROUP CREATE", lambda: client.xgroup_create(key, PROBE_GROUP, id="0")),
        ("XREADGROUP", lambda: client.xreadgroup(PROBE_GROUP, "probe", {key: ">"}, count=1)),
        ("XPENDING", lambda: client.xpending_range(key, PROBE_GROUP, "-", "+", 1)),
        ("XCLAIM", lambda: client.xclaim(key, PROBE_GROUP, "probe", 0, ["0-1"], justid=True)),
        ("XACK", lambda: client.xack(key, PROBE_GROUP, "0-1")),
        ("XDEL", lambda: client.xdel(key, "0-1")),
        ("HSET", lambda: client.hset(f"{key}:hash", "probe", 1)),
        ("HGETALL", lambda: client.hgetall(f"{key}:hash")),
        ("MULTI/EXEC", lambda: client.pipeline(transaction=True).xlen(key).execute()),
        # keys of two slots in one command: a cluster node refuses it (CROSSSLOT), which is
        # how a cluster named without redis.cluster is found at once, whatever node it is
        ("DEL", lambda: client.delete(key, f"{key}:hash", _key_in_another_slot(key))),
    ]


def _denied(exc: redis.RedisError) -> bool:
    """An ACL denial: of the command itself, or of one a Lua script runs (which Redis reports
    as a script error, not as NOPERM)."""
    return isinstance(exc, redis.exceptions.NoPermissionError) or (
        "can't run this command" in str(exc)
    )


def _key_in_another_slot(key: str) -> str:
    other = key
    while key_slot(other.encode()) == key_slot(key.encode()):
        other = f"{key.rsplit(':', 1)[0]}:{{{uuid.uuid4().hex[:12]}}}"
    return other


def check_access(
    client: redis.Redis,
    keys: StreamKeys,
    *,
    url: str,
    more: Callable[[redis.Redis, str], list[tuple[str, Callable[[], Any]]]] | None = None,
) -> None:
    """Run each command the daemon needs on a probe key; RedisAccessError names what failed.
    ``more(client, key)``: further probes of a role (keys under ``key``)."""
    # hash-tagged: the probe's keys share a slot on a cluster, like a camera's
    key = f"{keys.prefix}:probe:{{{uuid.uuid4().hex[:12]}}}"
    reached = False  # Redis answered at least once: the probe key may need removing
    probes = _daemon_probes(client, key) + (more(client, key) if more else [])
    try:
        for command, call in probes:
            try:
                call()
                reached = True
            except (redis.exceptions.NoPermissionError, redis.ResponseError) as exc:
                if not _denied(exc):
                    raise RedisAccessError(describe_redis_error(exc, url)) from None
                raise RedisAccessError(
                    f"the Redis user at {redact_url(url)} may not run {command} on {key!r} "
                    f"({exc}): grant the commands and keys listed in docs/operations.md"
                ) from None
            except redis.RedisError as exc:
                raise RedisAccessError(describe_redis_error(exc, url)) from None
    finally:
        try:
            if reached:
                client.delete(*(key + suffix for suffix in _PROBE_SUFFIXES))
        except redis.RedisError:
            pass  # the probe key may not be ours to delete; the error above says why


def describe_redis_error(exc: BaseException, url: str) -> str:
    """One line for a Redis error at start: where, what, and the likely fix."""
    where = redact_url(url) if url else "the private redis-server"
    detail = redact_url(str(exc).splitlines()[0][:200]) if str(exc) else type(exc).__name__
    tls = url_scheme(url) == "rediss"
    if isinstance(exc, redis.exceptions.AuthenticationError):
        hint = "check the user and password in redis.url"
    elif isinstance(exc, redis.exceptions.NoPermissionError):
        hint = "grant the commands and keys listed in docs/operations.md"
    elif refuses_as_cluster(exc):
        detail = f"{type(exc).__name__}: {detail}"  # MovedError: 8555 10.0.0.2:6379
        hint = "this Redis is a cluster node: set redis.cluster: true (consume: --cluster)"
    elif isinstance(exc, NotACluster):
        hint = "redis.cluster: true (consume: --cluster) needs a Redis Cluster node"
    elif tls and isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        hint = "rediss:// needs a TLS port: is TLS enabled there, or is the URL meant as redis://?"
    elif isinstance(exc, redis.ConnectionError) and "closed" in detail.lower():
        hint = "a server that closes at once may want TLS (rediss://) or a password"
    else:
        hint = "is redis-server running there?"
    return f"cannot use Redis at {where}: {detail} ({hint})"
