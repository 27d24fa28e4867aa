"""Acknowledging frames, always after what became of them is in Redis.

A frame entry is acknowledged (and deleted: frames are ~1 MB, and deleting keeps XLEN equal to
the backlog) only after its detection message is written by every sink, or in the same
MULTI/EXEC (or script) as, and after, its ledger entry.  A crash between the two repeats a
message (consumers de-duplicate by ``frame_id``), never loses one.

A detector worker under camera leases writes what it found of a camera and acknowledges its
frames only while no other worker holds the camera's lease, each camera's writes in one
script that looks first: a worker whose renewal ran late must not count or acknowledge what
the camera's new holder reads.  Nor does a camera's kept position ever move back: a write
re-sent late by a worker that was cut off can arrive while nobody holds the lease, after
another worker read the camera further.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis

from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import CameraPosition, LedgerEntry, merge_drops
from streams.redis_cluster import SlotTransactions
from streams.redis_errors import is_nogroup


def _unless_another_holds(lease: str, refused: str) -> str:
    """Lua that ends the script with ``refused`` when the camera's lease (``lease``: its KEYS
    element) is another worker's than ``ARGV[1]`` ('' for a worker without leases, never
    refused).  A lease that ran out and nobody took yet lets the write through: the next
    holder adopts the camera (reads its position, claims what is pending) only after taking
    the lease, so it sees what went through; and a Redis restarted without its data, whose
    leases are back at the holders' next renewal, loses no write meanwhile."""
    return (
        f"local holder = redis.call('GET', {lease})\n"
        f"if ARGV[1] ~= '' and holder and holder ~= ARGV[1] then return {refused} end\n"
    )


#: Lua: ``stream_id(text)``, a stream id's milliseconds and sequence (nil for anything else),
#: and ``older(a_ms, a_seq, b_ms, b_seq)``.  Stream ids only grow (every frame is added with
#: ``*``), so of two writes about a camera the one about the older entry was made first.
_STREAM_IDS = """
local function stream_id(text)
  local ms, seq = string.match(text or '', '^(%d+)-(%d+)$')
  if not ms then return nil end
  return tonumber(ms), tonumber(seq)
end
local function older(ms, seq, than_ms, than_seq)
  return ms < than_ms or (ms == than_ms and seq < than_seq)
end
"""

#: Lua: ``behind(cursor, from, to)``, whether the position in ``ARGV[from..to]`` (field, value
#: pairs) has a stream id (``entry_id``) older than the one kept in ``cursor``: a write that
#: would move the camera's position back, made before another worker read the camera further
#: and arriving only now (re-sent by the client of a worker that was cut off, while the lease
#: is nobody's).
_BEHIND = (
    _STREAM_IDS
    + """
local function behind(cursor, from, to)
  for i = from, to - 1, 2 do
    if ARGV[i] == 'entry_id' then
      local kept_ms, kept_seq = stream_id(redis.call('HGET', cursor, 'entry_id'))
      local ms, seq = stream_id(ARGV[i + 1])
      if not kept_ms or not ms then return false end
      return older(ms, seq, kept_ms, kept_seq)
    end
  end
  return false
end
"""
)

#: KEYS: cursor, lease; ARGV: the worker, then field, value pairs.  A camera's position is
#: written only while no other worker holds its lease, and never moved back: a write of a
#: worker cut off from Redis, sent again by its client once the network is back, must not move
#: the new owner's position back.  Sent as EVAL, not EVALSHA: inside MULTI an unknown sha fails
#: only at EXEC, after the rest of the transaction went through, and redis-py's cluster
#: pipelines refuse EVALSHA.
FENCED_POSITION = (
    _BEHIND
    + _unless_another_holds("KEYS[2]", "0")
    + """
if behind(KEYS[1], 2, #ARGV) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""
)


def _append_each(stream: str, maxlen: str, count: str) -> str:
    """Lua: ``count`` entries appended to ``stream`` (``MAXLEN ~ maxlen``) from ``ARGV[at]``
    on, each as its field count then its fields and values; ``at`` moves past them."""
    return (
        f"for _ = 1, tonumber({count}) do\n"
        "  local n = tonumber(ARGV[at])\n"
        f"  redis.call('XADD', {stream}, 'MAXLEN', '~', {maxlen}, '*',\n"
        "             unpack(ARGV, at + 1, at + n))\n"
        "  at = at + n + 1\n"
        "end\n"
    )


def _acknowledge_the_rest(stream: str, reply: str = "1") -> str:
    """Lua: ``ARGV[at]`` the frames group, the arguments after it entry ids of ``stream``, to
    acknowledge and delete (pcall: a group gone with a Redis restart is no error); then the
    script returns ``reply``."""
    return (
        "if #ARGV > at then\n"
        f"  redis.pcall('XACK', {stream}, ARGV[at], unpack(ARGV, at + 1))\n"
        f"  redis.pcall('XDEL', {stream}, unpack(ARGV, at + 1))\n"
        "end\n"
        f"return {reply}\n"
    )


#: KEYS: lease, ledger, cursor, frames stream; ARGV: the worker, the ledger's MAXLEN ~, the
#: number of ledger entries, the entries, the position's field count (0: none) then its
#: fields and values, the frames group, then the frame ids.  What a reader found of a camera
#: (drops, a session's end, its position) and the acknowledgement of the entries that showed
#: it go through together, and not at all for a worker whose camera another worker holds now,
#: or read further than this position (the reply is then the frames key): that one follows on
#: from the position it adopted, counts what is missing after it itself, and claims the
#: entries left pending here.  Written by a worker whose lease ran out unnoticed, such drops
#: were counted twice, once as frames its holder had detected.
FENCED_LEDGER_ACK = (
    _BEHIND
    + _unless_another_holds("KEYS[1]", "KEYS[4]")
    + """local at = 4
for _ = 1, tonumber(ARGV[3]) do at = at + tonumber(ARGV[at]) + 1 end
local n = tonumber(ARGV[at])
if behind(KEYS[3], at + 1, at + n) then return KEYS[4] end
at = 4
"""
    + _append_each("KEYS[2]", "ARGV[2]", "ARGV[3]")
    + """n = tonumber(ARGV[at])
if n > 0 then redis.call('HSET', KEYS[3], unpack(ARGV, at + 1, at + n)) end
at = at + n + 1
"""
    + _acknowledge_the_rest("KEYS[4]")
)

#: A camera's analytics state is kept as the state itself then ``\nafter <stream id>`` (the
#: newest frame it has seen): after the state's compressed data, which its readers ignore, so
#: that a worker of an earlier version reads it too (a rolling upgrade, a rollback), and one
#: kept without it (by such a worker) is read as it is.
STATE_AFTER = b"\nafter "
_STREAM_ID = re.compile(rb"\d+-\d+")


def kept_state(value: bytes) -> bytes:
    """The analytics state in a value of a camera's state key."""
    state, marker, newest = value.rpartition(STATE_AFTER)
    return state if marker and _STREAM_ID.fullmatch(newest) else value


#: KEYS: lease, analytics state, frames stream, events stream; ARGV: the worker ('' without
#: leases), the state, the events' MAXLEN ~, the number of events, the events, the frames
#: group, then the frame ids.  A camera's events and analytics state go with the
#: acknowledgement of the frames they come from, and none of them goes through for a worker
#: whose camera another worker holds now: its frames stay pending, for the new owner to claim
#: and analyse again from the state before them (the reply is then the frames key).  A state
#: of frames older than those of the state kept is not written (the reply is then the state's
#: key), its events and acknowledgement are: re-sent late by a worker that was cut off, while
#: the lease is nobody's, it would put the camera's tracks and counts back to before what
#: another worker analysed since (whose events for the same frames were the same: a repeat
#: consumers de-duplicate by event id); and frames published out of their order (a batch of
#: another image size first) must not be left pending for ever.
FENCED_ANALYTICS_ACK = (
    _STREAM_IDS
    + _unless_another_holds("KEYS[1]", "KEYS[3]")
    + """local at = 5
for _ = 1, tonumber(ARGV[4]) do at = at + tonumber(ARGV[at]) + 1 end
local newest, newest_ms, newest_seq
for i = at + 1, #ARGV do
  local ms, seq = stream_id(ARGV[i])
  if ms and (not newest or older(newest_ms, newest_seq, ms, seq)) then
    newest, newest_ms, newest_seq = ARGV[i], ms, seq
  end
end
local reply = 1
-- GET, not GETRANGE: the commands a worker's Redis user may run are documented
local kept = string.sub(redis.call('GET', KEYS[2]) or '', -48)
local kept_ms, kept_seq = stream_id(string.match(kept, '\\nafter ([%d%-]+)$'))
if newest and kept_ms and older(newest_ms, newest_seq, kept_ms, kept_seq) then
  reply = KEYS[2]
elseif newest then
  redis.call('SET', KEYS[2], ARGV[2] .. '\\nafter ' .. newest)
else
  redis.call('SET', KEYS[2], ARGV[2])
end
at = 5
"""
    + _append_each("KEYS[4]", "ARGV[3]", "ARGV[4]")
    + _acknowledge_the_rest("KEYS[3]", "reply")
)


@dataclass(frozen=True)
class FramesAcknowledged:
    """What became of a published batch's acknowledgement, by camera."""

    #: another worker holds their lease now: nothing written, their frames left pending for it
    #: (it publishes them again, a repeat consumers de-duplicate by ``frame_id``)
    refused: set[str] = field(default_factory=set)
    #: a state of newer frames is kept: their frames acknowledged and their events written,
    #: their state not (analysis goes on from the state in Redis)
    superseded: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class StreamAck:
    """What a reader found in one camera's stream: ledger entries (drops, a session's end),
    the camera's position (camera leases), and the entries that showed them, to acknowledge."""

    key: str  # the camera's frames stream
    ids: list[bytes]
    entries: list[LedgerEntry] = field(default_factory=list)
    position: CameraPosition | None = None


@dataclass(frozen=True)
class AnalyticsWrite:
    """A camera's analytics to write with the acknowledgement of its frames: events (wire
    fields, in order) and the state after them."""

    events: list[dict[str, str | int]]
    state: bytes


class FrameAcks:
    """Writes ledger entries and acknowledges frames for one batch worker (or a drain)."""

    def __init__(
        self,
        *,
        redis_client: redis.Redis,
        keys: StreamKeys,
        ledger_maxlen: int,
        lease_holder: str | None = None,
    ):
        """``lease_holder``: the worker whose camera leases fence its position writes."""
        self._redis = redis_client
        self._keys = keys
        self._ledger_maxlen = ledger_maxlen
        self._lease_holder = lease_holder
        # by camera: the newest position this worker sent (its reader's thread) or adopted
        # (its lease keeper's, before the reader reads the camera); the keeper compares
        self._sent: dict[str, CameraPosition] = {}
        # cameras whose fenced writes were refused since the lease keeper last looked (the
        # reader's and the publisher's threads add, the keeper's takes)
        self._refusals: set[str] = set()
        self._refusals_lock = threading.Lock()

    @property
    def lease_holder(self) -> str | None:
        return self._lease_holder

    def transactions(self, *, atomic: bool = True) -> SlotTransactions:
        """MULTI/EXEC pipelines, one a camera on a Redis Cluster: a write Redis refuses at
        queueing (out of memory, say) aborts the whole of its camera's, so an acknowledgement
        never goes through without what it acknowledges.  ``atomic=False`` for writes that
        stand alone (``SlotTransactions``)."""
        return SlotTransactions(self._redis, atomic=atomic)

    def write_ledger(self, tx: SlotTransactions, entries: list[LedgerEntry]) -> None:
        for entry in merge_drops(entries):
            key = self._keys.ledger(entry.camera)
            tx.on(key).xadd(
                key,
                entry.to_fields(),
                maxlen=self._ledger_maxlen,
                approximate=True,
            )

    @staticmethod
    def ack_and_delete(tx: SlotTransactions, key: str, ids: list[bytes]) -> None:
        tx.on(key).xack(key, FRAMES_GROUP, *ids)
        tx.on(key).xdel(key, *ids)

    def noted(self, camera: str, position: CameraPosition) -> None:
        """This worker is at ``position`` of the camera (it adopted it, or sends it)."""
        sent = self._sent.get(camera)
        if sent is None or position.received(sent.entry_id):  # not behind what was sent
            self._sent[camera] = position

    def read_on_elsewhere(self, camera: str, kept: CameraPosition) -> bool:
        """Whether the position ``kept`` in Redis is past any this worker sent or adopted:
        another worker read the camera further (this one's lease had run out meanwhile)."""
        sent = self._sent.get(camera)
        return not (sent or CameraPosition()).received(kept.entry_id)

    def record_position(self, tx: SlotTransactions, camera: str, position: CameraPosition) -> None:
        """Where the next worker to read the camera takes over (camera leases); only while
        no other worker holds the camera's lease."""
        if self._lease_holder is None:
            raise RuntimeError("positions are kept by detector workers, which hold leases")
        self.noted(camera, position)
        pairs = _flat(position.to_fields())
        keys = [self._keys.cursor(camera), self._keys.lease(camera)]
        # execute_command: redis-py's cluster pipelines have no eval()
        tx.on(keys[0]).execute_command(
            "EVAL", FENCED_POSITION, len(keys), *keys, self._lease_holder, *pairs
        )

    def acknowledge(
        self,
        key: str,
        ids: list[bytes],
        entries: list[LedgerEntry] | None = None,
        *,
        position: CameraPosition | None = None,
    ) -> bool:
        """Ledger entries first (with the camera's ``position`` when given), then the
        acknowledgement, in one round trip.  False: refused, another worker holds the
        camera's lease now or kept a position past this one."""
        return not self.acknowledge_streams([StreamAck(key, ids, entries or [], position)])

    def acknowledge_streams(self, acks: list[StreamAck]) -> set[str]:
        """Each stream's ledger entries, position and acknowledgement, all in one round trip
        (one per node on a cluster); returns the cameras refused: another worker holds their
        lease now (or kept a position past theirs), and nothing of theirs was written (their
        entries stay pending for the holder).  A
        worker without leases writes them in one transaction a camera."""
        if self._lease_holder is None:
            tx = self.transactions()
            for ack in acks:
                if ack.position is not None:
                    raise RuntimeError("positions are kept by detector workers, which hold leases")
                self.write_ledger(tx, ack.entries)
                if ack.ids:
                    self.ack_and_delete(tx, ack.key, ack.ids)
            self.execute(tx)
            return set()
        tx = self.transactions(atomic=False)  # each camera's is one script
        for ack in acks:
            if ack.ids or ack.entries or ack.position is not None:
                self._fenced_ack(tx, ack)
        return self._refused(self.execute(tx), [ack.key for ack in acks])

    def _fenced_ack(self, tx: SlotTransactions, ack: StreamAck) -> None:
        camera = self._keys.camera_from_frames(ack.key)
        entries = merge_drops(ack.entries)
        args: list[str | int | bytes] = [self._lease_holder or "", self._ledger_maxlen]
        args.append(len(entries))
        for entry in entries:
            fields = _flat(entry.to_fields())
            args += [len(fields), *fields]
        pairs = [] if ack.position is None else _flat(ack.position.to_fields())
        if ack.position is not None:
            self.noted(camera, ack.position)
        args += [len(pairs), *pairs, FRAMES_GROUP, *ack.ids]
        keys = [
            self._keys.lease(camera),
            self._keys.ledger(camera),
            self._keys.cursor(camera),
            ack.key,
        ]
        tx.on(ack.key).execute_command("EVAL", FENCED_LEDGER_ACK, len(keys), *keys, *args)

    def _refused(self, results: list[object], frames_keys: list[str]) -> set[str]:
        """The cameras whose fenced script answered with their frames key: refused."""
        keys = {key.encode() for key in frames_keys}
        refused = {
            self._keys.camera_from_frames(r) for r in results if isinstance(r, bytes) and r in keys
        }
        if refused:
            with self._refusals_lock:
                self._refusals |= refused
        return refused

    def take_refusals(self) -> set[str]:
        """The cameras whose writes were refused since the last call: another worker holds
        their lease now, or a position past this worker's is kept (``read_on_elsewhere``)."""
        with self._refusals_lock:
            refused, self._refusals = self._refusals, set()
        return refused

    def acknowledge_frames(
        self,
        ids_by_stream: dict[str, list[bytes]],
        analytics: Mapping[str, AnalyticsWrite] | None = None,
        *,
        events_maxlen: int = 100_000,
    ) -> FramesAcknowledged:
        """A published batch's frames, of several streams, in one round trip (on a cluster,
        one per node: what they acknowledge, the detections, is written already).
        ``analytics``: by camera, events and state, each camera's in one fenced script with its
        acknowledgement (``FENCED_ANALYTICS_ACK``)."""
        analytics = analytics or {}
        tx = self.transactions(atomic=bool(analytics) and self._lease_holder is None)
        for key, ids in ids_by_stream.items():
            camera = self._keys.camera_from_frames(key)
            write = analytics.get(camera)
            if write is None:
                if self._lease_holder is None:
                    self.ack_and_delete(tx, key, ids)
                else:
                    self._fenced_ack(tx, StreamAck(key, ids))
                continue
            events: list[str | int | bytes] = []
            for fields in write.events:
                events.append(2 * len(fields))
                events += [item for pair in fields.items() for item in pair]
            keys = [
                self._keys.lease(camera),
                self._keys.analytics_state(camera),
                key,
                self._keys.object_events(camera),
            ]
            tx.on(key).execute_command(
                "EVAL",
                FENCED_ANALYTICS_ACK,
                len(keys),
                *keys,
                self._lease_holder or "",
                write.state,
                events_maxlen,
                len(write.events),
                *events,
                FRAMES_GROUP,
                *ids,
            )
        results = self.execute(tx)
        states = {self._keys.analytics_state(camera).encode(): camera for camera in analytics}
        return FramesAcknowledged(
            self._refused(results, list(ids_by_stream)),
            {states[r] for r in results if isinstance(r, bytes) and r in states},
        )

    @staticmethod
    def execute(tx: SlotTransactions) -> list[object]:
        """Run a pipeline (retried through an outage by the client) and return its replies.
        An acknowledgement that finds no group is no error: Redis restarted without the
        frames, which are gone either way (the reader re-creates the group)."""
        results = tx.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, Exception) and not is_nogroup(result):
                raise result
        return results


def _flat(fields: Mapping[str, str | int]) -> list[str]:
    """A hash's fields as the field, value, ... arguments of HSET and XADD."""
    return [str(item) for pair in fields.items() for item in pair]
