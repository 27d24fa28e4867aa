"""Acknowledging frames, always after what became of them is in Redis.

A frame entry is acknowledged (and deleted: frames are ~1 MB, and deleting keeps XLEN equal to
the backlog) only after its detection message is written by every sink, or in the same
MULTI/EXEC as, and after, its ledger entry.  A crash between the two repeats a message
(consumers de-duplicate by ``frame_id``), never loses one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis

from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import CameraPosition, LedgerEntry, merge_drops
from streams.redis_cluster import SlotTransactions
from streams.redis_errors import is_nogroup

#: KEYS: cursor, lease; ARGV: the worker, then field, value pairs.  A camera's position is
#: written only by the worker holding its lease: a write of a worker cut off from Redis, sent
#: again by its client once the network is back, must not move the new owner's position back.
#: Sent as EVAL, not EVALSHA: inside MULTI an unknown sha fails only at EXEC, after the rest
#: of the transaction went through, and redis-py's cluster pipelines refuse EVALSHA.
FENCED_POSITION = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""

#: KEYS: lease, analytics state, frames stream, events stream; ARGV: the worker ('' without
#: leases), the state, the frames group, the events' MAXLEN ~, the number of events, each event
#: as its field count then its fields and values, then the frame ids.  A camera's events and
#: analytics state go with the acknowledgement of the frames they come from, and none of them
#: goes through for a worker that lost the camera's lease: its frames stay pending, for the new
#: owner to claim and analyse again from the state before them (the reply is then the state's
#: key).  (pcall: a group gone with a Redis restart is no error.)
FENCED_ANALYTICS_ACK = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return KEYS[2] end
redis.call('SET', KEYS[2], ARGV[2])
local at = 6
for _ = 1, tonumber(ARGV[5]) do
  local n = tonumber(ARGV[at])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', unpack(ARGV, at + 1, at + n))
  at = at + n + 1
end
if #ARGV >= at then
  redis.pcall('XACK', KEYS[3], ARGV[3], unpack(ARGV, at))
  redis.pcall('XDEL', KEYS[3], unpack(ARGV, at))
end
return 1
"""


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

    def record_position(self, tx: SlotTransactions, camera: str, position: CameraPosition) -> None:
        """Where the next worker to read the camera takes over (camera leases); only while
        this worker holds the camera's lease."""
        if self._lease_holder is None:
            raise RuntimeError("positions are kept by detector workers, which hold leases")
        pairs = [str(v) for item in position.to_fields().items() for v in item]
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
        camera: str = "",
    ) -> None:
        """Ledger entries first (with the camera's ``position`` when given), then the
        acknowledgement, in one round trip."""
        tx = self.transactions()
        self.write_ledger(tx, entries or [])
        if position is not None:
            self.record_position(tx, camera, position)
        if ids:
            self.ack_and_delete(tx, key, ids)
        self.execute(tx)

    def acknowledge_frames(
        self,
        ids_by_stream: dict[str, list[bytes]],
        analytics: Mapping[str, AnalyticsWrite] | None = None,
        *,
        events_maxlen: int = 100_000,
    ) -> set[str]:
        """A published batch's frames, of several streams, in one round trip (on a cluster,
        one per node: what they acknowledge, the detections, is written already).
        ``analytics``: by camera, events and state, each camera's in one fenced script with its
        acknowledgement.  Returns the cameras whose analytics were refused: this worker no
        longer holds their leases (their frames stay pending for the new owner)."""
        analytics = analytics or {}
        tx = self.transactions(atomic=bool(analytics))
        state_keys: dict[bytes, str] = {}
        for key, ids in ids_by_stream.items():
            camera = self._keys.camera_from_frames(key)
            write = analytics.get(camera)
            if write is None:
                self.ack_and_delete(tx, key, ids)
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
            state_keys[keys[1].encode()] = camera
            tx.on(key).execute_command(
                "EVAL",
                FENCED_ANALYTICS_ACK,
                len(keys),
                *keys,
                self._lease_holder or "",
                write.state,
                FRAMES_GROUP,
                events_maxlen,
                len(write.events),
                *events,
                *ids,
            )
        results = self.execute(tx)
        return {state_keys[r] for r in results if isinstance(r, bytes) and r in state_keys}

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
