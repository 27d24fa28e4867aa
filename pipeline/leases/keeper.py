"""One detector worker's side of the camera leases (``framebatch detect``): turns what each
lease tick decided into changes of the worker's reader.

* gained: the frames the camera's previous worker read and never finished are claimed
  (pending on this worker's consumer now), and the camera is adopted from the position that
  worker kept in Redis, so the next seq follows on without a gap or a repeat;
* lost (another worker holds it already: this one was cut off past the TTL): read no more,
  and the frames waiting in the batching queue stay pending for the other worker;
* handing over (another worker wins it now): read no more, finish what was read, then let
  the lease go;
* held again by a renewal that came when the lease may have run out (a host cut off or
  starved past the TTL): if another worker read the camera on and let go meanwhile (its
  kept position is past this worker's), dropped and adopted again from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from pipeline.batching import CameraRules
from pipeline.leases.camera_leases import CameraLeases
from pipeline.stages.changes import CameraChange, CameraChanges
from pipeline.stages.context import WorkerContext
from streams.groups import claim_pending_each
from streams.messages import CameraPosition, LedgerEntry
from streams.redis_errors import is_nogroup

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self,
        context: WorkerContext,
        *,
        leases: CameraLeases,
        changes: CameraChanges,
        rules: Callable[[str], CameraRules],
        clock: Callable[[], float] = time.monotonic,
    ):
        """``context``: the worker's (its consumer name is the worker id holding the leases);
        ``changes``: the worker's reader's, which this turns lease changes into."""
        self._leases = leases
        self._changes = changes
        self._redis = context.redis
        self._keys = context.keys
        self._accounting = context.accounting
        self._acks = context.acks
        self._consumer = context.consumer
        self._rules = rules
        self._clock = clock
        self._next_tick = 0.0
        self._handing_over: dict[str, CameraChange] = {}
        self._reading: set[str] = set()  # cameras the reader was told to read and still reads
        # held again after their leases may have run out: to look whether another worker read
        # them on meanwhile (``CameraLeases.retaken``)
        self._retaken: set[str] = set()

    def tick(self) -> None:
        """Call often (the supervisor's tick); renews the leases every ``tick_s``.

        What the reader is told is settled from the leases' state, not from the tick's report:
        a tick an error cuts short (a Redis error halfway through the cameras) has already
        moved cameras in or out of ``held`` without reporting them, and a camera lost so and
        taken back later would be read on from where the reader was, past the frames claimed
        for it meanwhile, and one won so would be held and never read.  (A detector worker's
        run ends on such an error today; the keeper stays right whoever outlives it.)"""
        if self._clock() < self._next_tick:
            self._release_finished()
            return
        self._next_tick = self._clock() + self._leases.tick_s  # should this one fail
        try:
            changes = self._leases.tick()
        finally:
            self._settle()
        self._next_tick = self._clock() + self._leases.next_tick_in()
        if changes:
            log.info(
                "workers %s; this one reads %d camera(s)",
                ", ".join(changes.workers),
                len(self._leases.held),
            )
        self._release_finished()

    def _settle(self) -> None:
        """Tell the reader what changed in the leases since it was last told."""
        leases = self._leases
        told = self._reading | set(self._handing_over)
        # a camera whose write was refused while this worker still holds it: a position
        # past its own is kept (written while the lease was nobody's), so it is looked at
        # as one held again late is, and taken over again from there; left alone, its
        # entries stayed pending here until the worker restarted
        refused = self._acks.take_refusals() & (leases.held | leases.handing_over)
        self._retaken = (self._retaken | leases.retaken | refused) & told
        for camera in self._read_on_elsewhere():
            # adopted again below (or, handed over, let go at once), from the position kept
            log.warning(
                "camera %s: another worker read it on (while this one's lease had run out, "
                "or it was nobody's); taken over again from the position kept in Redis",
                camera,
            )
            self._reading.discard(camera)
            self._handing_over.pop(camera, None)
            self._changes.drop(camera)
        told = self._reading | set(self._handing_over)
        for camera in sorted(told - leases.held - leases.handing_over):
            log.warning("camera %s: its lease went to another worker; stopped reading it", camera)
            self._reading.discard(camera)
            self._handing_over.pop(camera, None)
            self._changes.drop(camera)
        for camera in sorted(leases.handing_over - set(self._handing_over)):
            if camera in self._reading:
                self._reading.discard(camera)
                self._handing_over[camera] = self._changes.pause(camera)
            else:  # won and given up before the reader was told: nothing of it was read
                leases.release(camera)
        gained = sorted(leases.held - self._reading)
        if gained:
            self._adopt(gained)

    def _read_on_elsewhere(self) -> list[str]:
        """Of the cameras held again after their leases may have run out (or whose writes were
        refused while held), those another worker read further meanwhile (their kept
        positions are past this worker's).  The others
        read on as they were: dropping them would read this worker's own frames in flight a
        second time.  A Redis error leaves them to be looked at after the next renewal."""
        cameras = sorted(self._retaken)
        if not cameras:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for camera in cameras:
            pipe.hgetall(self._keys.cursor(camera))
        try:
            cursors = pipe.execute()
        except redis.RedisError as exc:
            log.warning("kept positions not read (looked at again next tick): %s", exc)
            return []
        self._retaken.clear()
        return [
            camera
            for camera, cursor in zip(cameras, cursors, strict=True)
            if self._acks.read_on_elsewhere(camera, CameraPosition.from_fields(cursor))
        ]

    def _adopt(self, cameras: list[str]) -> None:
        """The cameras won: what their previous workers left pending claimed, their positions
        read (a few round trips for all), and the reader told.  Only while the leases are
        surely this worker's: a tick that ran late (a starved host) may have let them run out,
        and claiming then would take the frames of the worker that holds them now, which,
        behind the position it adopted, never looks for them again.  Those are adopted after
        the next renewal."""
        if not self._leases.valid():
            return
        keys = [self._keys.frames(camera) for camera in cameras]
        # the positions first: what a claim finds trimmed is known from its answer alone, so
        # every camera's is written before anything can fail (an error raised after the others)
        pipe = self._redis.pipeline(transaction=False)
        for camera in cameras:
            pipe.hgetall(self._keys.cursor(camera))
        cursors = pipe.execute()
        claims = claim_pending_each(self._redis, keys, self._consumer)
        failed: redis.ResponseError | None = None
        for camera, key, cursor in zip(cameras, keys, cursors, strict=True):
            claim = claims[key]
            if isinstance(claim, redis.ResponseError):
                if not is_nogroup(claim):
                    failed = failed or claim  # adopted at the next settle
                    continue
                # Redis lost its data: no group, nothing pending; the reader makes the group
                claim = (0, 0)
            claimed, trimmed = claim
            position = CameraPosition.from_fields(cursor)
            self._accounting.track(camera)
            if trimmed:  # read by the previous worker, then trimmed from the stream: lost
                self._acks.acknowledge(key, [], self._lost(camera, position.session, trimmed))
            self._acks.noted(camera, position)
            self._changes.adopt(camera, self._rules(camera), position)
            self._reading.add(camera)
            log.info(
                "camera %s: taken over at %s (%d unfinished frames claimed)",
                camera,
                position,
                claimed,
            )
        if failed is not None:
            raise failed

    def _lost(self, camera: str, session: str | None, count: int) -> list[LedgerEntry]:
        entries = []
        for _ in range(count):
            self._accounting.on_claimed(camera)
            entries.append(self._accounting.on_shed(camera, "worker_lost", session or ""))
        return entries

    def _release_finished(self) -> None:
        finished = [
            camera
            for camera, pause in self._handing_over.items()
            if pause.applied.is_set() and self._accounting.outstanding(camera) == 0
        ]
        for camera in finished:
            self._changes.forget(camera)
        self._leases.release_all(finished)  # an error: let go again at the next tick
        for camera in finished:
            del self._handing_over[camera]
            log.info("camera %s: handed over", camera)

    def holds(self, camera: str) -> bool:
        return camera in self._leases.held

    def leased(self, camera: str) -> bool:
        """Held, or being handed over: lost ones leave at the renewal that finds them lost,
        before the reader is told (``LeaseGate``)."""
        return camera in self._leases.held or camera in self._leases.handing_over

    def add_camera(self, camera: str) -> None:
        self._leases.add_camera(camera)

    def drop_camera(self, camera: str) -> None:
        """A camera retired: read no more, its lease let go, never taken again."""
        if camera in self._reading or camera in self._handing_over:
            self._changes.forget(camera)
            self._handing_over.pop(camera, None)
            self._reading.discard(camera)
        self._leases.drop_camera(camera)

    def may_read(self) -> bool:
        """The reader's gate: its leases are surely still its own."""
        return self._leases.valid()

    def keep_alive(self) -> None:
        """While stopping: renew the leases held (nothing new is taken) until the frames read
        are finished; an outage here only lets the others take over sooner."""
        if self._clock() < self._next_tick:
            return
        self._next_tick = self._clock() + self._leases.tick_s
        try:
            self._leases.renew()
        except redis.RedisError as exc:
            log.warning("leases not renewed while stopping: %s", exc)

    def leave(self) -> None:
        """After the worker stopped and finished its frames: the others take over now."""
        self._leases.leave()
