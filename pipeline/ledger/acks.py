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

#: KEYS: lease, analytics state, frames stream; ARGV: the worker ('' without leases), the state,
#: the frames group, then the frame ids.  A camera's analytics state goes with the
#: acknowledgement of the frames it has seen, and neither goes through for a worker that lost
#: the camera's lease: its frames stay pending, for the new owner to claim and analyse again
#: from the state before them.  (pcall: a group gone with a Redis restart is no error.)
FENCED_ANALYTICS_ACK = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
if #ARGV > 3 then
  redis.pcall('XACK', KEYS[3], ARGV[3], unpack(ARGV, 4))
  redis.pcall('XDEL', KEYS[3], unpack(ARGV, 4))
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
    ) -> None:
        """A published batch's frames, of several streams, in one round trip (on a cluster,
        one per node: what they acknowledge, the detections, is written already).
        ``analytics``: by camera, events and state, each camera's in one transaction with its
        acknowledgement (fenced by its lease under leases)."""
        analytics = analytics or {}
        tx = self.transactions(atomic=bool(analytics))
        for key, ids in ids_by_stream.items():
            camera = self._keys.camera_from_frames(key)
            write = analytics.get(camera)
            if write is None:
                self.ack_and_delete(tx, key, ids)
                continue
            events_key = self._keys.object_events(camera)
            for fields in write.events:
                tx.on(events_key).xadd(events_key, fields, maxlen=events_maxlen, approximate=True)
            keys = [self._keys.lease(camera), self._keys.analytics_state(camera), key]
            holder = self._lease_holder or ""
            tx.on(key).execute_command(
                "EVAL",
                FENCED_ANALYTICS_ACK,
                len(keys),
                *keys,
                holder,
                write.state,
                FRAMES_GROUP,
                *ids,
            )
        self.execute(tx)

    @staticmethod
    def execute(tx: SlotTransactions) -> None:
        """Run a pipeline (retried through an outage by the client).  An acknowledgement
        that finds no group is no error: Redis restarted without the frames, which are gone
        either way (the reader re-creates the group)."""
        for result in tx.execute(raise_on_error=False):
            if isinstance(result, Exception) and not is_nogroup(result):
                raise result
