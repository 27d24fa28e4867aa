"""Redis Cluster: clients, and the two kinds of command that would otherwise span slots.

On a cluster a command, a MULTI/EXEC or a script may touch keys of one hash slot only.  Every
key of a camera shares the camera's hash tag (``streams.keys``), so what framebatch does to
one camera is legal; what it does to several cameras at once is split here:

- :class:`SlotTransactions`: MULTI/EXEC writes to several cameras.  On a single Redis they
  go in one transaction (one round trip); on a cluster each camera's writes are their own
  transaction (what must be atomic, a camera's ledger entry, position and acknowledgement, is
  always one camera's), and writes that need no atomicity (a batch's detections, plain
  acknowledgements) go in one pipeline, which redis-py sends each node its share of.
- :func:`read_streams`: XREAD / XREADGROUP over several streams.  On a single Redis one call,
  blocking; on a cluster one non-blocking read per stream, pipelined (redis-py sends each
  node its share), polled every ``CLUSTER_POLL_S`` while nothing comes: a blocking read would
  hold one node's connection while frames arrive on another.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import redis
from redis._parsers import CommandsParser
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterCrossSlotError, RedisClusterException
from redis.retry import Retry

#: How often an idle reader asks a cluster again; the most a frame waits for it.
CLUSTER_POLL_S = 0.005


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def connect_cluster(url: str, *, reconnect_timeout_s: float, **options: Any) -> RedisCluster:
    """A cluster client from any node's URL (the others are found with CLUSTER SHARDS).  It
    retries a command for about ``reconnect_timeout_s`` (backoff capped at 1 s; redis-py
    counts attempts, not time), refreshing the slot map on each failure, which also follows
    a failover to a replica."""
    retries = math.ceil(reconnect_timeout_s)
    try:
        client = RedisCluster.from_url(
            url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=retries), **options
        )
    except RedisClusterException as exc:
        # redis-py wraps what went wrong with the node: unwrap it (a refused password, an
        # unreachable host), and say so plainly when the node is no cluster node
        chain, cause = [], exc.__cause__
        while cause is not None and cause not in chain:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        for cause in chain:
            if isinstance(cause, redis.RedisError):  # CLUSTER SLOTS denied by the ACL too
                if not isinstance(cause, redis.ResponseError) or isinstance(
                    cause, redis.exceptions.NoPermissionError
                ):
                    raise cause from None
        if any("not enabled" in str(e) for e in [exc, *chain]):
            raise NotACluster("cluster mode is not enabled on this node") from None
        raise redis.ConnectionError(str(exc)) from None
    client.commands_parser.__class__ = _StreamKeysParser
    return client


class NotACluster(redis.RedisError):
    """The URL given as a Redis Cluster's names a Redis that is not one (or whose CLUSTER
    SLOTS the user may not run)."""


class _StreamKeysParser(CommandsParser):
    """redis-py finds the keys of XREAD, XREADGROUP and (in pipelines) EVAL, commands with
    movable keys, by asking a node with COMMAND GETKEYS: a second round trip for each.  Their
    keys are plain to see."""

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        command = str(args[0]).upper()
        if command in ("EVAL", "EVALSHA"):
            return list(args[3 : 3 + int(args[2])])
        if command in ("XREAD", "XREADGROUP"):
            words = [a.upper() if isinstance(a, str | bytes) else a for a in args]
            at = words.index(b"STREAMS" if b"STREAMS" in words else "STREAMS")
            streams = args[at + 1 :]
            return list(streams[: len(streams) // 2])
        return super().get_keys(redis_conn, *args)


class SlotTransactions:
    """MULTI/EXEC pipelines for writes that may span cameras: ``on(key)`` is the one a write
    to ``key`` goes to (in order), ``execute()`` runs them all and returns every command's
    result (or exception, with ``raise_on_error=False``), pipelines in the order first used.

    ``atomic=False``: the writes need no transaction (each command stands alone; a failure is
    raised, and what went through is repeated at most, never lost): on a cluster they share
    one plain pipeline, a round trip per node instead of one per camera."""

    def __init__(self, client: Any, *, atomic: bool = True):
        self._client = client
        self._cluster = is_cluster(client)
        self._atomic = atomic
        self._pipes: dict[str, Any] = {}

    def on(self, key: str) -> Any:
        group = hash_tag(key) if self._cluster and self._atomic else ""
        pipe = self._pipes.get(group)
        if pipe is None:
            transaction = self._atomic or not self._cluster
            pipe = self._pipes[group] = self._client.pipeline(transaction=transaction)
        return pipe

    def execute(self, *, raise_on_error: bool = True) -> list[Any]:
        results: list[Any] = []
        for pipe in self._pipes.values():
            results += pipe.execute(raise_on_error=raise_on_error)
        self._pipes.clear()
        return results


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes of ``key``: the text inside its first ``{...}``, if any."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1 : end] if start >= 0 and end > start + 1 else key


def read_streams(
    client: Any,
    streams: Mapping[str, Any],
    *,
    group: str | None = None,
    consumer: str | None = None,
    count: int | None = None,
    block_ms: int | None = None,
) -> list[Any]:
    """XREADGROUP (with ``group``) or XREAD over ``streams`` (key: id), as redis-py returns
    it: ``[[key, [(id, fields), ...]], ...]``; ``block_ms=None`` returns at once."""
    if not is_cluster(client):
        if group is None:
            return client.xread(dict(streams), count=count, block=block_ms)
        return client.xreadgroup(group, consumer, dict(streams), count=count, block=block_ms)
    deadline = None if block_ms is None else time.monotonic() + block_ms / 1000
    while True:
        pipe = client.pipeline(transaction=False)
        for key, entry_id in streams.items():
            if group is None:
                pipe.xread({key: entry_id}, count=count)
            else:
                pipe.xreadgroup(group, consumer, {key: entry_id}, count=count)
        results = pipe.execute(raise_on_error=False)  # errors as Redis wrote them (NOGROUP)
        for result in results:
            if isinstance(result, Exception):
                raise result
        reply = [item for result in results for item in result or []]
        left = None if deadline is None else deadline - time.monotonic()
        if reply or left is None or left <= 0:
            return reply
        time.sleep(min(CLUSTER_POLL_S, left))


def refuses_as_cluster(error: BaseException) -> bool:
    """A single-Redis client talking to a cluster node: the node redirects it, or refuses
    keys of several slots in one command."""
    return isinstance(error, AskError | ClusterCrossSlotError)  # MovedError is an AskError
