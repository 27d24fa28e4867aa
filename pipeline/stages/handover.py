"""The reader's side of the camera leases (``framebatch detect``): what changes in reading a
camera that moves between detector workers.

* A camera adopted from its previous worker: the frames that worker had received and never
  finished are claimed already (pending on this worker), so they are not gaps in ``seq``; if
  one of them was trimmed from the stream meanwhile, it was lost with that worker.
* Before a gap in ``seq`` is counted as dropped, its frames may be pending on another worker
  instead (one cut off from Redis whose read was carried out after its lease ran out): they
  are claimed and received first, in stream order, so the gap is only what is really missing.
* A stream's last entries have no gap after them to reveal them: a reply set aside (read
  after the leases may have run out) or a read delivered after the camera's next worker had
  claimed what was pending leaves them pending on a consumer that will not finish them.  So a
  camera quiet for a while, its end not read, is looked at: entries after the newest one
  received that are pending anywhere are claimed and received (a decoder's end entry, most
  often, which nothing follows).
* Each camera's position (session, last seq, stream id) is kept in Redis with its ledger
  entries, so the next worker to read it follows on without a gap or a repeat.
* A camera whose lease went to another worker is neither received nor swept from the moment
  the renewal that finds it lost, before the reader lets it go: a read held up by a cut, or a
  sweep due meanwhile, would otherwise take frames its holder is reading and count the gap
  they leave as dropped.

A worker without leases (``framebatch run``) reads with :data:`NO_HANDOVER`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from pipeline.stages.context import WorkerContext
from streams.groups import claim, pending_between
from streams.messages import CameraPosition, LedgerEntry, message_kind

log = logging.getLogger(__name__)

STRAY_PAGE = 1000  # frames of one gap looked for on other workers at most
#: a camera read nothing for this long (and not ended) has its stream's tail looked at; the
#: wait doubles while it stays quiet, up to the longest (a camera whose decoder is down costs
#: one XPENDING a minute)
QUIET_TAIL_S = 2.0
QUIET_TAIL_LONGEST_S = 60.0
QUIET_SWEEP_S = 0.5  # how often the streams are gone over for quiet ones

Entry = tuple[bytes, dict[bytes, bytes]]


class LeaseGate(Protocol):
    """What a reader under camera leases asks of them (``LeaseKeeper``)."""

    def may_read(self) -> bool:
        """The leases held are surely still this worker's (false while a renewal is late)."""
        ...

    def leased(self, camera: str) -> bool:
        """``camera``'s lease is this worker's (held, or being handed over)."""
        ...


class NoHandover:
    """Cameras that never change hands: every hook does nothing."""

    def may_read(self) -> bool:
        return True

    def leased(self, camera: str) -> bool:
        return True

    def adopt(self, key: str, position: CameraPosition) -> None:
        pass

    def release(self, key: str) -> None:
        pass

    def history_read(self, key: str) -> None:
        pass

    def strays(self, key: str, camera: str, entry_id: bytes, fields: dict) -> list[Entry]:
        return []

    def lost(self, key: str, camera: str, entry_id: bytes, fields: dict) -> LedgerEntry | None:
        return None

    def seen(self, key: str, entry_id: bytes) -> None:
        pass

    def quiet_tails(
        self, read_ids: Mapping[str, str], camera_of: Mapping[str, str]
    ) -> list[tuple[str, list[Entry]]]:
        return []

    def claimed(self, key: str, entry_id: bytes) -> bool:
        return False

    def position(self, camera: str) -> CameraPosition | None:
        return None

    def record_positions(self, cameras: list[str]) -> None:
        pass


NO_HANDOVER = NoHandover()


class CameraHandover(NoHandover):
    """Owned by one reader thread."""

    def __init__(
        self,
        context: WorkerContext,
        *,
        leases: LeaseGate,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``leases``: reads wait while they may have run out; a lost camera is left alone."""
        self._context = context
        self._leases = leases
        self._clock = clock
        # per stream: when its tail is looked at next, and the wait after that
        self._tail_at: dict[str, float] = {}
        self._tail_wait: dict[str, float] = {}
        self._next_sweep = 0.0
        # adopted cameras: frames up to here were received by their previous worker
        self._claimed_through: dict[str, CameraPosition] = {}
        self._last_entry: dict[str, str] = {}  # per stream: the newest entry received

    def may_read(self) -> bool:
        return self._leases.may_read()

    def leased(self, camera: str) -> bool:
        return self._leases.leased(camera)

    def adopt(self, key: str, position: CameraPosition) -> None:
        self._claimed_through[key] = position
        # from here on (the newest entry this reader received, if it read the camera before,
        # may be past the position: what it wrote after that was refused, and is read again)
        self._last_entry[key] = position.entry_id

    def release(self, key: str) -> None:
        self._claimed_through.pop(key, None)
        self._tail_at.pop(key, None)

    def history_read(self, key: str) -> None:
        """This reader's own pending entries of ``key`` are all read again."""
        self._claimed_through.pop(key, None)

    def claimed(self, key: str, entry_id: bytes) -> bool:
        """Received by the camera's previous worker, never finished: this worker's now."""
        claimed = self._claimed_through.get(key)
        return claimed is not None and claimed.received(entry_id)

    def seen(self, key: str, entry_id: bytes) -> None:
        self._last_entry[key] = entry_id.decode()
        self._tail_at[key] = self._clock() + QUIET_TAIL_S
        self._tail_wait[key] = QUIET_TAIL_S

    def quiet_tails(
        self, read_ids: Mapping[str, str], camera_of: Mapping[str, str]
    ) -> list[tuple[str, list[Entry]]]:
        """For each stream read (key: the id it is read from) quiet past its time, its camera's
        end not read: the entries after the newest one received pending on any consumer,
        claimed, in stream order.  Streams whose own pending history is still being read are
        left to that read, which returns them."""
        now, context, found = self._clock(), self._context, []
        if now < self._next_sweep or not self.may_read():
            return found
        self._next_sweep = now + QUIET_SWEEP_S
        for key, read_id in read_ids.items():
            camera = camera_of[key]
            at = self._tail_at.setdefault(key, now + QUIET_TAIL_S)
            if read_id != ">" or now < at or context.accounting.ended([camera]):
                continue
            if not self.leased(camera):
                continue  # lost: what is pending is its holder's, being read or to be claimed
            wait = self._tail_wait.get(key, QUIET_TAIL_S)
            self._tail_at[key] = now + wait
            self._tail_wait[key] = min(2 * wait, QUIET_TAIL_LONGEST_S)
            # never behind what is received or claimed here: those are this reader's already
            after = self.position(camera).entry_id
            ids = pending_between(context.redis, key, after=after, before=None, count=STRAY_PAGE)
            if not ids:
                continue
            entries = [(i, f) for i, f in claim(context.redis, key, context.consumer, ids) if f]
            log.warning(
                "camera %s: %d entries left pending after its last read were claimed",
                camera,
                len(entries),
            )
            found.append((key, entries))
        return found

    def lost(self, key: str, camera: str, entry_id: bytes, fields: dict) -> LedgerEntry | None:
        """A frame the previous worker had received, claimed, then trimmed from the stream (an
        entry that comes back empty): lost with that worker, counted ``worker_lost``."""
        if fields or not self.claimed(key, entry_id):
            return None
        accounting = self._context.accounting
        accounting.on_claimed(camera)
        return accounting.on_shed(camera, "worker_lost", self._claimed_through[key].session or "")

    def strays(self, key: str, camera: str, entry_id: bytes, fields: dict) -> list[Entry]:
        """The frames of the gap before this entry (before a new session's first entry: any
        entry since the last one received) that are pending on a consumer (another worker's,
        or this one's from a reply it set aside), claimed: to be received first."""
        if not fields or self.claimed(key, entry_id):
            return []
        session = fields.get(b"session", b"").decode()
        if message_kind(fields) == "end":
            next_seq = int(fields[b"frames"])
        else:
            next_seq = int(fields[b"seq"])
        if not self._context.accounting.would_gap(camera, session, next_seq):
            return []
        context = self._context
        after = self._last_entry.get(key, "0-0")
        ids = pending_between(context.redis, key, after=after, before=entry_id, count=STRAY_PAGE)
        if not ids:
            return []
        strays = claim(context.redis, key, context.consumer, ids)
        log.warning("camera %s: %d frames another worker read were claimed", camera, len(strays))
        return [(stray_id, stray_fields or {}) for stray_id, stray_fields in strays]

    def position(self, camera: str) -> CameraPosition:
        """The camera's position, never behind the one it was adopted at (claimed frames read
        back are older entries than that)."""
        key = self._context.keys.frames(camera)
        position = replace(
            self._context.accounting.position(camera), entry_id=self._last_entry.get(key, "0-0")
        )
        claimed = self._claimed_through.get(key)
        if claimed is not None and claimed.received(position.entry_id):
            position = replace(position, entry_id=claimed.entry_id)
        return position

    def record_positions(self, cameras: list[str]) -> None:
        """The positions of cameras just read, each write standing alone."""
        if not cameras:
            return
        acks = self._context.acks
        tx = acks.transactions(atomic=False)
        for camera in cameras:
            acks.record_position(tx, camera, self.position(camera))
        acks.execute(tx)
