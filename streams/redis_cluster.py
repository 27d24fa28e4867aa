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
  node its share), polled while nothing comes (a blocking read would hold one node's
  connection while frames arrive on another): every ``CLUSTER_POLL_S``, or, for a reader that
  keeps a :class:`StreamPolls`, each stream after waits that grow while it gives nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import redis
from redis._parsers import CommandsParser
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterDownError,
    RedisClusterException,
    TryAgainError,
)
from redis.retry import Retry

from streams.redis_errors import is_nogroup, is_outage

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How often a reader asks a cluster's stream that may give entries any moment (one without a
#: ``StreamPolls``: every stream, always); the most a frame then waits for it.
CLUSTER_POLL_S = 0.005

#: A cluster reader asks a stream whose entries come at a steady interval every
#: ``CLUSTER_POLL_S`` only around when the next one is due, and one that gives nothing otherwise
#: (overdue, or with no steady interval) after an eighth of the time it has been so, at most
#: ``IDLE_POLL_MAX_S`` (``StreamPolls``): asked every 5 ms, a camera sampled at 0.5 fps was
#: asked 400 times between two frames, 222 XREADGROUPs a frame at 250 cameras a worker
#: (docs/benchmarks.md, "The fleet")
IDLE_POLL_SHARE = 0.125
IDLE_POLL_MAX_S = 0.25


class StreamPolls:
    """When a reader asks each of its streams on a cluster next: at once after one gave
    entries; while it gives none, around when its next entry is due (from the interval
    between its entries' ids, and their lead on this reader's clock), and otherwise after
    waits that grow with the time it has been quiet or overdue.  A group's stream read from
    an id other than ``>`` (a reader's own pending entries) is always asked."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._due: dict[str, float] = {}  # by stream: when it is asked next
        self._found_at: dict[str, float] = {}  # by stream: when it last gave entries
        self._steps: dict[str, _Steps] = {}  # by stream: the times of its entries

    def __len__(self) -> int:
        return len(self._due)

    def due(self, streams: Mapping[str, Any], *, group: bool = True) -> list[str]:
        """The streams to ask now (``group``: read with XREADGROUP)."""
        now = self._clock()
        return [
            key
            for key, entry_id in streams.items()
            if (group and not _new(entry_id)) or self._due.get(key, now) <= now
        ]

    def next_due(self, streams: Mapping[str, Any]) -> float:
        """When the first of ``streams`` is due."""
        now = self._clock()
        return min((self._due.get(key, now) for key in streams), default=now)

    def answered(self, key: str, entries: list[Any], *, new: bool) -> None:
        """``key`` gave ``entries`` (``new``: entries added since the last read, not a
        group's pending ones)."""
        now = self._clock()
        if entries:
            if new:
                self._steps.setdefault(key, _Steps()).saw(entries, now)
            self._due[key] = now  # there may be more
            self._found_at[key] = now
            return
        steps = self._steps.get(key)
        lead = None if steps is None else steps.lead(now)
        if steps is not None and lead is not None and lead > -steps.margin:
            # the next entry is due in ``lead`` s: halve the way there, then ask often; never
            # more than IDLE_POLL_MAX_S at once, so a clock offset learnt from late reads (a
            # reader busy at start) costs that much at most and is corrected by the next read
            wait = min(lead - steps.margin, lead / 2, IDLE_POLL_MAX_S)
        else:
            # overdue, or no steady interval known: an eighth of the time it has been so, so
            # that a frame waits at most an eighth of its own lateness more
            quiet = -lead if lead is not None else now - self._found_at.setdefault(key, now)
            wait = min(quiet * IDLE_POLL_SHARE, IDLE_POLL_MAX_S)
        self._due[key] = now + max(CLUSTER_POLL_S, wait)

    def forget(self, keep: Mapping[str, Any]) -> None:
        """Streams no longer read leave the schedule."""
        for table in (self._due, self._found_at, self._steps):
            for key in [k for k in table if k not in keep]:
                del table[key]


class _Steps:
    """The times of one stream's entries: the interval between them (from their ids, in the
    server's milliseconds), how much it varies, and the offset from the server's clock to the
    reader's, to tell when the next entry is due on the reader's clock."""

    def __init__(self) -> None:
        self.newest_ms: int | None = None
        self.interval: float | None = None
        self.jitter = 0.0
        self.offset: float | None = None  # reader's clock - server's, at the quickest read

    @property
    def margin(self) -> float:
        """How early before its due time a stream is asked often, and how late after it."""
        return 2 * CLUSTER_POLL_S + 2 * self.jitter

    def saw(self, entries: list[Any], now: float) -> None:
        newest = _id_ms(entries[-1][0])
        # the smallest lead of the reader's clock over the server's seen (rising slowly, to
        # follow a clock set back); each read sees it plus how late the read came
        lead = now - newest / 1000
        self.offset = lead if self.offset is None else min(lead, self.offset + 0.001)
        if self.newest_ms is not None and newest > self.newest_ms:
            step = (newest - self.newest_ms) / 1000 / len(entries)
            if self.interval is None:
                self.interval = step
            else:
                self.jitter = 0.75 * self.jitter + 0.25 * abs(step - self.interval)
                self.interval = 0.75 * self.interval + 0.25 * step
        self.newest_ms = newest if self.newest_ms is None else max(newest, self.newest_ms)

    def lead(self, now: float) -> float | None:
        """Seconds until the next entry is due on the reader's clock (negative: overdue);
        None while not known."""
        if self.interval is None or self.offset is None or self.newest_ms is None:
            return None
        return self.newest_ms / 1000 + self.interval + self.offset - now


def _no_op() -> None:
    pass


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def connect_cluster(url: str, *, reconnect_timeout_s: float, **options: Any) -> RedisCluster:
    """A cluster client from any node's URL (the others are found with CLUSTER SLOTS).  Its
    commands and pipelines ride out an outage (a node down, a failover under way, the whole
    cluster away) for ``reconnect_timeout_s``, as a single Redis's client does: redis-py's own
    retries are attempts without waiting, so they are wrapped in a wait with backoff that
    re-reads the slot map after each failure.  An outage that outlasts it is raised as
    ``redis.ConnectionError``."""
    try:
        client = _ride_out(
            lambda: _OutageTolerantCluster.from_url(
                url, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=2), **options
            ),
            reconnect_timeout_s,
        )
    except RedisClusterException as exc:
        raise unwrap(exc) from None
    client.outage_timeout_s = reconnect_timeout_s
    client.commands_parser.__class__ = _StreamKeysParser
    return client


def unwrap(error: RedisClusterException) -> redis.RedisError:
    """What a RedisClusterException (no RedisError) stands for: the node's refusal it wraps
    (a wrong password, CLUSTER SLOTS denied), :class:`NotACluster`, else a ConnectionError."""
    chain, cause = [], error.__cause__
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for cause in chain:
        if isinstance(cause, redis.RedisError) and (
            not isinstance(cause, redis.ResponseError)
            or isinstance(cause, redis.exceptions.NoPermissionError)
        ):
            return cause
    if any("not enabled" in str(e) for e in [error, *chain]):
        return NotACluster("cluster mode is not enabled on this node")
    return redis.ConnectionError(f"Redis Cluster unreachable: {error}")


def is_cluster_outage(error: BaseException) -> bool:
    """The cluster, or the node a command needs, cannot answer now: down, failing over,
    slots not covered.  Not: a refused password or command."""
    if isinstance(error, RedisClusterException):  # redis-py's own, no RedisError
        return is_outage(unwrap(error))
    return is_outage(error) or isinstance(error, ClusterDownError | TryAgainError)


def _ride_out(do: Callable[[], T], timeout_s: float, on_failure: Callable[[], None] = _no_op) -> T:
    """``do()``, again with backoff while the cluster is out, for up to ``timeout_s``."""
    backoff = ExponentialBackoff(cap=1.0, base=0.05)
    failures, deadline = 0, None
    while True:
        try:
            result = do()
        except Exception as error:
            if not is_cluster_outage(error):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + timeout_s
                if timeout_s > 0:
                    log.warning(
                        "Redis Cluster unreachable (%s): retrying for up to %.0f s",
                        error,
                        timeout_s,
                    )
            if now >= deadline:  # said as what a single Redis's client raises
                if isinstance(error, redis.ConnectionError | redis.TimeoutError):
                    raise
                if isinstance(error, RedisClusterException):
                    raise unwrap(error) from error
                raise redis.ConnectionError(f"Redis Cluster unreachable: {error}") from error
            failures += 1
            time.sleep(min(backoff.compute(failures), max(0.0, deadline - now)))
            try:
                on_failure()
            except Exception:  # noqa: BLE001 - the next attempt says what is wrong
                pass
        else:
            if failures and timeout_s > 0:
                log.warning("Redis Cluster answers again after %d failed attempts", failures)
            return result


class _OutageTolerantCluster(RedisCluster):
    """Commands and pipelines that ride out an outage (``_ride_out``)."""

    outage_timeout_s = 0.0

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return _ride_out(
            lambda: super(_OutageTolerantCluster, self).execute_command(*args, **kwargs),
            self.outage_timeout_s,
            self.nodes_manager.initialize,
        )

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        pipe.__class__ = _OutageTolerantPipeline
        pipe.outage_timeout_s = self.outage_timeout_s
        return pipe


class _OutageTolerantPipeline(ClusterPipeline):
    outage_timeout_s = 0.0

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """The commands, with those that met an outage sent again (only those: a node that
        answered must not read or write twice) until they go through or the outage outlasts
        ``outage_timeout_s``; then as redis-py's ``execute``."""
        queued = [(c.args, dict(c.options)) for c in self._execution_strategy.command_queue]
        results: list[Any] = [None] * len(queued)
        todo = list(range(len(queued)))
        sent = False

        def attempt() -> list[Any]:
            nonlocal todo, sent
            if sent:  # redis-py empties the pipeline after each attempt
                for i in todo:
                    self.pipeline_execute_command(*queued[i][0], **dict(queued[i][1]))
            sent = True
            for i, answer in zip(todo, ClusterPipeline.execute(self, False), strict=True):
                results[i] = answer
            todo = [i for i in todo if is_cluster_outage_result(results[i])]
            if todo:
                raise results[todo[0]]  # to _ride_out: wait, then send those again
            return results

        _ride_out(attempt, self.outage_timeout_s, self.nodes_manager.initialize)
        if raise_on_error:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results


def is_cluster_outage_result(result: Any) -> bool:
    return isinstance(result, Exception) and is_cluster_outage(result)


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
            # after GROUP <group> <consumer>: a group or consumer may be named "streams"
            first = 4 if command == "XREADGROUP" else 1
            words = [a.upper() if isinstance(a, str | bytes) else a for a in args]
            at = next(i for i in range(first, len(words)) if words[i] in ("STREAMS", b"STREAMS"))
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
    polls: StreamPolls | None = None,
) -> list[Any]:
    """XREADGROUP (with ``group``) or XREAD over ``streams`` (key: id), as redis-py returns
    it: ``[[key, [(id, fields), ...]], ...]``; ``block_ms=None`` returns at once.  ``polls``:
    on a cluster, which streams are asked each time (default: all of them)."""
    if not is_cluster(client):
        if group is None:
            return client.xread(dict(streams), count=count, block=block_ms)
        return client.xreadgroup(group, consumer, dict(streams), count=count, block=block_ms)
    if block_ms == 0:
        raise ValueError("block_ms=0 (forever) is not supported")
    if polls is not None and len(polls) > len(streams):
        polls.forget(streams)
    deadline = None if block_ms is None else time.monotonic() + block_ms / 1000
    while True:
        keys = list(streams) if polls is None else polls.due(streams, group=group is not None)
        reply = _read_each(client, {key: streams[key] for key in keys}, group, consumer, count)
        if polls is not None:
            found = {_text(key): entries for key, entries in reply}
            for key in keys:
                new = group is None or _new(streams[key])
                polls.answered(key, found.get(key, []), new=new)
        left = None if deadline is None else deadline - time.monotonic()
        if reply or left is None or left <= 0:
            return reply
        wait = CLUSTER_POLL_S if polls is None else polls.next_due(streams) - time.monotonic()
        time.sleep(max(0.0, min(wait, left)))


def _read_each(
    client: Any,
    streams: Mapping[str, Any],
    group: str | None,
    consumer: str | None,
    count: int | None,
) -> list[Any]:
    """One non-blocking read per stream, pipelined (redis-py sends each node its share)."""
    if not streams:
        return []
    pipe = client.pipeline(transaction=False)
    for key, entry_id in streams.items():
        if group is None:
            pipe.xread({key: entry_id}, count=count)
        else:
            pipe.xreadgroup(group, consumer, {key: entry_id}, count=count)
    results = pipe.execute(raise_on_error=False)  # errors as Redis wrote them (NOGROUP)
    reply = [item for r in results if not isinstance(r, Exception) for item in r or []]
    errors = {key: r for key, r in zip(streams, results, strict=True) if isinstance(r, Exception)}
    if errors:
        missing = [key for key, error in errors.items() if is_nogroup(error)]
        if len(missing) < len(errors):
            raise next(e for e in errors.values() if not is_nogroup(e))
        # the other streams' reads went through: their entries are pending on the reader
        # now and must not be thrown away with the error
        raise GroupsMissing(missing, reply)
    return reply


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


class GroupsMissing(redis.ResponseError):
    """NOGROUP on a cluster: some streams lost their group (a node restarted without its
    data), the others were read; ``reply`` is what they gave."""

    def __init__(self, keys: list[str], reply: list[Any]):
        super().__init__(f"NOGROUP no consumer group on {', '.join(keys)}")
        self.keys = keys
        self.reply = reply


def server_time_ms(client: Any, key: str | None = None) -> int:
    """Redis's clock in ms: on a cluster, that of the node holding ``key`` (the clock its
    stream ids and scripts use), or without a key the earliest of every primary's."""
    if not is_cluster(client):
        seconds, micros = client.time()
        return seconds * 1000 + micros // 1000
    if key is not None:
        nodes = [client.get_node_from_key(key)]
    else:
        nodes = client.get_primaries()
    times = [client.execute_command("TIME", target_nodes=node) for node in nodes]
    return min(int(seconds) * 1000 + int(micros) // 1000 for seconds, micros in times)


def refuses_as_cluster(error: BaseException) -> bool:
    """A single-Redis client talking to a cluster node: the node redirects it, or refuses
    keys of several slots in one command."""
    return isinstance(error, AskError | ClusterCrossSlotError)  # MovedError is an AskError


def _new(entry_id: bytes | str) -> bool:
    """An XREADGROUP id asking for entries no consumer of the group was given yet."""
    return entry_id in (">", b">")


def _id_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])
