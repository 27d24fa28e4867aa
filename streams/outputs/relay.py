"""The relay from every camera's analytics events stream to the configured outputs.

One thread per output reads ``<prefix>:events:{<camera>}`` of every camera through the consumer
group ``output:<name>`` (each process its own consumer, so processes share the work), hands the
events to the output in batches of up to ``batch_size``, and acknowledges them only once
``deliver`` returned: a crash in between delivers them again (at least once; receivers
de-duplicate by event ``id``), never loses them.  Entries a dead process read and never
acknowledged are taken over (XAUTOCLAIM) once idle for ``claim_idle_s``.

The pipeline's writes never wait for an output: while one is away its events wait in Redis,
where each stream is capped (``redis.events_maxlen``).  An entry trimmed away before the group
read it is counted dropped, cause ``trimmed``: the read script compares, in one step with the
read, how many entries the stream ever held before its first one (``entries-added`` minus its
length) with how many the group has accounted for (its ``entries-read``), and moves the group's
count over what it counted, so that each is counted once, by one process.  Other causes:
``rejected`` (the receiver refused them), ``malformed`` (an entry no event could be read from).
Needs Redis 7.0 (``entries-read``, XAUTOCLAIM's list of deleted entries).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from streams.keys import StreamKeys
from streams.object_events import NewerSchema, ObjectEvent
from streams.outputs import open_output
from streams.outputs.base import (
    EventOutput,
    OutputOptions,
    OutputRejected,
    OutputUnavailable,
    backoff_delay,
)
from streams.redis_cluster import SlotTransactions
from streams.redis_errors import is_nogroup
from streams.urls import redact_url

log = logging.getLogger(__name__)

POLL_S = 0.2  # how long an idle relay waits before looking for new events
REFRESH_S = 1.0  # while an output is away: how often backlog and trimmed entries are counted
STOP_TIMEOUT_S = 5.0
RETRY_BASE_S = 0.5

#: KEYS[1]: a camera's events stream; ARGV: group, consumer, count (0: count only, read none).
#: The group is made (from the first entry still there) if missing.  Entries the group never
#: read and the stream no longer holds are counted and the group's entries-read moved over
#: them, in one step with the read (between two steps a read could jump over them unseen).
#: Returns {trimmed, lag (unread entries still there; nil if unknown), pending, entries}.
READ_SCRIPT = """
local key, group = KEYS[1], ARGV[1]
local function map(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local function before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
if redis.call('EXISTS', key) == 0 then
  redis.call('XGROUP', 'CREATE', key, group, '0', 'MKSTREAM', 'ENTRIESREAD', 0)
  return {0, 0, 0, {}}
end
local stream = map(redis.call('XINFO', 'STREAM', key))
local length = stream['length']
local gone = stream['entries-added'] - length
local info
for _, flat in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local g = map(flat)
  if g['name'] == group then info = g end
end
if not info then
  redis.call('XGROUP', 'CREATE', key, group, '0', 'ENTRIESREAD', gone)
  info = {['last-delivered-id'] = '0-0', ['entries-read'] = gone, ['pending'] = 0}
end
local read, trimmed = info['entries-read'], 0
local last = info['last-delivered-id']
if length == 0 or before(last, stream['first-entry'][1]) then
  if read and gone > read then trimmed = gone - read end
  if (not read) or trimmed > 0 then
    redis.call('XGROUP', 'SETID', key, group, last, 'ENTRIESREAD', gone)
    read = gone
  end
end
local entries = {}
if tonumber(ARGV[3]) > 0 then
  local reply = redis.call('XREADGROUP', 'GROUP', group, ARGV[2], 'COUNT', ARGV[3],
                           'STREAMS', key, '>')
  if reply then entries = reply[1][2] end
end
local lag = false
if read then lag = stream['entries-added'] - read - #entries end
return {trimmed, lag, info['pending'] + #entries, entries}
"""


#: KEYS[1]: a stream; ARGV: group, consumer, idle ms. Deletes the consumer only if it still
#: has nothing pending and is still idle: between a look and a delete it could have read.
FORGET_SCRIPT = """
for _, flat in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local c = {}
  for i = 1, #flat, 2 do c[flat[i]] = flat[i + 1] end
  if c['name'] == ARGV[2] and c['pending'] == 0 and c['idle'] > tonumber(ARGV[3]) then
    return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
  end
end
return -1
"""


def _no_group(error: Exception) -> bool:
    """The group (or its stream) is not there yet: the next read makes both."""
    return is_nogroup(error) or "no such key" in str(error).lower()


def output_group(name: str) -> str:
    """The consumer group through which an output reads the events streams."""
    return f"output:{name}"


def consumer_name() -> str:
    """Unique per process (and per start of it): host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class OutputStats:
    """One output's counts, from this process (``backlog`` and ``pending``: the whole
    group's, as of the last look)."""

    name: str
    kind: str
    delivered: int  # acknowledged by the receiver, by this process
    dropped: Mapping[str, int]  # by cause: trimmed, rejected, malformed
    backlog: int  # events in Redis the group has not read yet
    pending: int  # read by the group's consumers, not yet acknowledged
    held: int  # in this process's hands, being delivered
    failing: bool  # the last try failed: the receiver is away
    last_error: str | None
    last_error_at: float | None  # epoch seconds


@dataclass(frozen=True)
class _Entry:
    key: str
    entry_id: bytes
    event: ObjectEvent


class _Feed:
    """One output's thread: read, deliver, acknowledge."""

    def __init__(
        self,
        options: OutputOptions,
        output: EventOutput,
        *,
        redis_client: redis.Redis,
        keys: StreamKeys,
        cameras: Callable[[], Iterable[str]],
        consumer: str,
        stop: threading.Event,
        poll_s: float,
        counter: redis.Redis,
    ):
        self.options = options
        self.output = output
        self._redis = redis_client
        self._counter = counter  # fails fast: for counts, which must not wait for Redis
        self._keys = keys
        self._cameras = cameras
        self._consumer = consumer
        self._group = output_group(options.output_name)
        self._stop = stop
        #: set to end a wait early: the relay stopping, or the output's receiver back
        self.wake = threading.Event()
        if (on_back := getattr(output, "on_back", None)) is not None:  # ReconnectingOutput
            on_back(self.wake.set)
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._held: list[_Entry] = []  # read, being delivered (in order)
        self._to_ack: dict[str, list[bytes]] = {}  # delivered; the XACK is to be retried
        self._cursors: dict[str, bytes] = {}  # XAUTOCLAIM's, by stream
        self._groups: dict[str, tuple[int | None, int]] = {}  # by stream: (lag, pending)
        self._next_claim = 0.0
        self._next_refresh = 0.0
        self._failures = 0
        self._redis_away = False  # the last failure was Redis's
        self._newer_seen = False  # events of a newer schema, said once
        self._last_refreshed_claim = 0.0
        self.delivered = 0
        self.dropped: Counter[str] = Counter()
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.thread = threading.Thread(
            target=self.run, name=f"output-{options.output_name}", daemon=True
        )

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stop.is_set():
            try:
                wait_s = self._step()
                self._redis_away = False
            except redis.RedisError as exc:
                self._redis_away = True
                wait_s = self._failed(f"Redis: {redact_url(str(exc))}")
            except Exception as exc:  # a bug must not end the relay: counted, logged, retried
                if not self._failures:
                    log.exception("output %r: unexpected error", self.output.name)
                wait_s = self._failed(f"{type(exc).__name__}: {exc}")
            if wait_s:
                self._pause(wait_s)

    def _pause(self, wait_s: float) -> None:
        """Wait ``wait_s`` or until woken; while the output is away, its backlog and what the
        stream's cap trimmed are counted every ``REFRESH_S`` of the wait (its gauges stood
        still for as long as the backoff, up to ``retry_max_s``)."""
        until = time.monotonic() + wait_s
        while (left := until - time.monotonic()) > 0:
            if self.wake.wait(min(left, REFRESH_S) if self._failures else left):
                break
            if self._failures and not self._redis_away and not self._stop.is_set():
                self.count_waiting()
        self.wake.clear()

    def _step(self) -> float:
        """One round; returns how long to wait before the next."""
        if self._to_ack:
            self._acknowledge(self._to_ack)
            self._to_ack = {}
        streams = self._streams()
        if not self._held:
            now = time.monotonic()
            if now >= self._next_claim:
                self._next_claim = now + max(1.0, self.options.claim_idle_s / 2)
                self._claim(streams)
            if not self._held:
                self._read(streams, self.options.batch_size)
            if not self._held:
                return self._poll_s
        return self._deliver_batch(streams)

    def _streams(self) -> list[str]:
        return list(dict.fromkeys(self._keys.object_events(c) for c in self._cameras()))

    # --- reading ------------------------------------------------------------------------------
    def _read(self, streams: Sequence[str], count: int, client: redis.Redis | None = None) -> None:
        """New entries of every stream (``count`` 0: only the group's counts), through
        ``client`` where given."""
        if not streams:
            return
        tx = SlotTransactions(client or self._redis, atomic=False)
        for key in streams:
            tx.on(key).execute_command(
                "EVAL", READ_SCRIPT, 1, key, self._group, self._consumer, count
            )
        read: list[_Entry] = []
        malformed: dict[str, list[bytes]] = {}
        trimmed = 0
        failure: Exception | None = None
        # each stream's script ran whether another failed or not: take what each read
        for key, reply in zip(streams, tx.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):
                failure = failure or reply
                continue
            gone, lag, pending, entries = reply
            trimmed += gone
            self._groups[key] = (lag, pending)
            for entry_id, flat in entries:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                self._take(key, entry_id, fields, read, malformed)
        self._count_dropped("trimmed", trimmed)
        self._held += read
        if malformed:
            self._acknowledge(malformed)
        if failure is not None:
            raise failure

    def _claim(self, streams: Sequence[str]) -> None:
        """Entries read by a consumer idle for ``claim_idle_s`` (a process that died) and
        never acknowledged; forget consumers with nothing pending that are long idle."""
        if not streams:
            return
        idle_ms = int(self.options.claim_idle_s * 1000)
        tx = SlotTransactions(self._redis, atomic=False)
        for key in streams:
            start = self._cursors.get(key, b"0-0")
            tx.on(key).xautoclaim(
                key, self._group, self._consumer, idle_ms, start, count=self.options.batch_size
            )
            tx.on(key).xinfo_consumers(key, self._group)
        replies = tx.execute(raise_on_error=False)
        claimed: list[_Entry] = []
        malformed: dict[str, list[bytes]] = {}
        forget = SlotTransactions(self._redis, atomic=False)
        trimmed = forgotten = 0
        for index, key in enumerate(streams):
            autoclaim, consumers = replies[2 * index], replies[2 * index + 1]
            for reply in (autoclaim, consumers):
                if isinstance(reply, Exception) and not _no_group(reply):
                    raise reply
            if isinstance(autoclaim, Exception):  # no group yet: the next read makes it
                continue
            cursor, entries = autoclaim[0], autoclaim[1]
            deleted = autoclaim[2] if len(autoclaim) > 2 else []
            self._cursors[key] = cursor
            trimmed += len(deleted)  # read by the dead consumer, trimmed before delivery
            for entry_id, fields in entries:
                if fields is None:  # Redis < 7: trimmed, claimed without its fields
                    trimmed += 1
                    malformed.setdefault(key, []).append(entry_id)
                    continue
                self._take(key, entry_id, fields, claimed, malformed)
            for consumer in consumers if isinstance(consumers, list) else []:
                name = consumer["name"]
                name = name.decode() if isinstance(name, bytes) else name
                if name != self._consumer and not consumer["pending"]:
                    if consumer["idle"] > idle_ms:  # checked again in one step with the delete
                        forget.on(key).execute_command(
                            "EVAL", FORGET_SCRIPT, 1, key, self._group, name, idle_ms
                        )
                        forgotten += 1
        if forgotten:
            forget.execute(raise_on_error=False)
        self._count_dropped("trimmed", trimmed)
        if claimed:
            log.info(
                "output %r: took over %d events a stopped consumer had read",
                self.output.name,
                len(claimed),
            )
        self._held = claimed + self._held
        if malformed:
            self._acknowledge(malformed)

    def _take(
        self,
        key: str,
        entry_id: bytes,
        fields: dict[bytes, bytes],
        into: list[_Entry],
        malformed: dict[str, list[bytes]],
    ) -> None:
        try:
            into.append(_Entry(key, entry_id, ObjectEvent.from_fields(fields)))
        except NewerSchema as exc:
            # a rolling upgrade: left pending (never acknowledged) for a newer process of the
            # group to claim once idle; said once
            if not self._newer_seen:
                self._newer_seen = True
                log.warning(
                    "output %r: %s; left for a newer framebatch of this group to deliver",
                    self.output.name,
                    exc,
                )
        except (ValueError, KeyError, TypeError) as exc:
            log.warning(
                "output %r: entry %s of %s is no event (%s): dropped",
                self.output.name,
                entry_id.decode(),
                key,
                exc,
            )
            self._count_dropped("malformed", 1)
            malformed.setdefault(key, []).append(entry_id)

    # --- delivering -------------------------------------------------------------------------
    def _deliver_batch(self, streams: Sequence[str]) -> float:
        batch = self._held[: self.options.batch_size]
        if self._failures:
            self._keep_claimed(batch)
        try:
            self.output.deliver([entry.event for entry in batch])
        except OutputRejected as exc:
            refused = len(batch) if exc.refused is None else exc.refused
            log.warning(
                "output %r: %d of %d events refused: %s",
                self.output.name,
                refused,
                len(batch),
                exc,
            )
            self._record_error(str(exc))
            self._count_dropped("rejected", refused)
            with self._lock:
                self.delivered += len(batch) - refused
            self._failures = 0  # the receiver answers
        except OutputUnavailable as exc:
            return self._failed(str(exc), streams)
        else:
            with self._lock:
                self.delivered += len(batch)
            if self._failures:
                log.info(
                    "output %r delivers again, after %d failed tries",
                    self.output.name,
                    self._failures,
                )
            self._failures = 0
        del self._held[: len(batch)]
        done: dict[str, list[bytes]] = {}
        for entry in batch:
            done.setdefault(entry.key, []).append(entry.entry_id)
        self._to_ack = done
        self._acknowledge(done)
        self._to_ack = {}
        return 0.0

    def _keep_claimed(self, batch: Sequence[_Entry]) -> None:
        """While retrying: reset the idle time of the entries in hand, so that no other
        process takes them over as a dead consumer's."""
        now = time.monotonic()
        if now - self._last_refreshed_claim < self.options.claim_idle_s / 3:
            return
        self._last_refreshed_claim = now
        ids: dict[str, list[bytes]] = {}
        for entry in batch:
            ids.setdefault(entry.key, []).append(entry.entry_id)
        tx = SlotTransactions(self._redis, atomic=False)
        for key, entry_ids in ids.items():
            tx.on(key).xclaim(key, self._group, self._consumer, 0, entry_ids, justid=True)
        self._check(tx.execute(raise_on_error=False))

    def _acknowledge(self, ids: Mapping[str, list[bytes]]) -> None:
        tx = SlotTransactions(self._redis, atomic=False)
        for key, entry_ids in ids.items():
            tx.on(key).xack(key, self._group, *entry_ids)
        self._check(tx.execute(raise_on_error=False))

    @staticmethod
    def _check(replies: list[Any]) -> None:
        """A group gone (Redis restarted without its data) is no error: the next read makes
        it again; anything else is."""
        for reply in replies:
            if isinstance(reply, Exception) and not is_nogroup(reply):
                raise reply

    def _failed(self, problem: str, streams: Sequence[str] = ()) -> float:
        """The receiver (or Redis) is away: note it, count what waits, say how long to wait."""
        self._failures += 1
        if self._failures == 1:
            log.warning("output %r: %s; retrying", self.output.name, problem)
        self._record_error(problem)
        now = time.monotonic()
        if streams and now >= self._next_refresh and not self._redis_away:
            self._next_refresh = now + REFRESH_S
            self.count_waiting()  # backlog, and what the cap trimmed meanwhile
        # the entries in hand are claimed again between tries, at least every claim_idle_s / 3
        max_s = min(self.options.retry_max_s, self.options.claim_idle_s / 3)
        return backoff_delay(self._failures, base_s=min(RETRY_BASE_S, max_s), max_s=max_s)

    # --- counts -------------------------------------------------------------------------------
    def count_waiting(self) -> None:
        """Backlog and pending as Redis has them now (from the feed's thread, or once it has
        stopped), through the counting client: a count must not wait for Redis."""
        try:
            self._read(self._streams(), 0, self._counter)
        except Exception:  # Redis away, a camera list that failed: the last look stands
            log.debug("output %r: backlog not counted", self.output.name, exc_info=True)

    def _record_error(self, problem: str) -> None:
        with self._lock:
            self.last_error, self.last_error_at = redact_url(problem), time.time()

    def _count_dropped(self, cause: str, count: int) -> None:
        if count > 0:
            with self._lock:
                self.dropped[cause] += count
            if cause == "trimmed":
                log.warning(
                    "output %r: %d events trimmed from their stream (redis.events_maxlen) "
                    "before they were delivered",
                    self.output.name,
                    count,
                )

    def stats(self) -> OutputStats:
        with self._lock:
            groups = list(self._groups.values())
            return OutputStats(
                name=self.output.name,
                kind=self.options.kind,
                delivered=self.delivered,
                dropped=dict(self.dropped),
                backlog=sum(lag or 0 for lag, _ in groups),
                pending=sum(pending for _, pending in groups),
                held=len(self._held),
                failing=self._failures > 0,
                last_error=self.last_error,
                last_error_at=self.last_error_at,
            )


class OutputRelay:
    """Delivers every camera's analytics events to the configured outputs, one thread each.

    ``cameras`` is asked every poll (cameras come and go while it runs).  ``stop()`` ends the
    threads (a batch being delivered is finished and acknowledged if it can be within the
    time given) and closes the outputs.  Nothing an output or Redis does raises into the
    caller once started: failures are counted (``stats()``) and logged once per outage.
    """

    def __init__(
        self,
        outputs: Sequence[OutputOptions],
        *,
        redis_client: redis.Redis,
        keys: StreamKeys,
        cameras: Callable[[], Iterable[str]],
        poll_s: float = POLL_S,
        consumer: str | None = None,
        opener: Callable[[OutputOptions], EventOutput] = open_output,
        fail_fast: redis.Redis | None = None,
    ):
        """Opens each output (``OutputError``: bad input, those opened already closed).
        ``fail_fast``: a client of the same Redis that does not wait out outages, for the
        counts of what waits (which the stop makes too); default: ``redis_client``."""
        names = [options.output_name for options in outputs]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"output names must be unique: {', '.join(duplicates)}")
        self.consumer = consumer or consumer_name()
        self._stop = threading.Event()
        self._started = False
        self._feeds: list[_Feed] = []
        try:
            for options in outputs:
                self._feeds.append(
                    _Feed(
                        options,
                        opener(options),
                        redis_client=redis_client,
                        keys=keys,
                        cameras=cameras,
                        consumer=self.consumer,
                        stop=self._stop,
                        poll_s=poll_s,
                        counter=fail_fast or redis_client,
                    )
                )
        except BaseException:
            self._close_outputs()
            raise

    def start(self) -> None:
        if self._started or self._stop.is_set():
            return
        self._started = True
        for feed in self._feeds:
            feed.thread.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Legal in every state, more than once; returns within about ``timeout_s``."""
        self._stop.set()
        for feed in self._feeds:
            feed.wake.set()
        deadline = time.monotonic() + timeout_s
        if self._started:
            # half the time to finish a delivery in flight, then the outputs are closed
            # (which ends a delivery still waiting), then the rest to join
            for feed in self._feeds:
                feed.thread.join(max(0.0, deadline - time.monotonic() - timeout_s / 2))
        self._close_outputs()
        if self._started:
            for feed in self._feeds:
                feed.thread.join(max(0.0, deadline - time.monotonic()))
                if feed.thread.is_alive():
                    log.warning("output %r did not stop in time", feed.output.name)

    def count_waiting(self) -> dict[str, OutputStats]:
        """After ``stop()``: each output's counts with its backlog and pending read from Redis
        now (an output still stopping, or Redis away, keeps its last look)."""
        for feed in self._feeds:
            if not feed.thread.is_alive():
                feed.count_waiting()
        return self.stats()

    def _close_outputs(self) -> None:
        for feed in self._feeds:
            try:
                feed.output.close()
            except Exception:  # closing the rest matters more
                log.exception("output %r: close failed", feed.output.name)

    def stats(self) -> dict[str, OutputStats]:
        """Each output's counts now, by name (thread-safe, no I/O)."""
        return {feed.output.name: feed.stats() for feed in self._feeds}
