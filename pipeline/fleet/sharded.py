"""``framebatch decode`` sharded by lease: the decode workers share the registered cameras as the
detector workers do (rendezvous hashing over the live workers, a lease per camera with a TTL,
``pipeline.leases.camera_leases`` with the decoders' keys), and every frame a decoder writes is
fenced by its lease (``streams.fence``).  At each tick of the supervisor:

* the registry is followed (:mod:`pipeline.fleet.registry`): a camera added is competed for, a
  changed one starts with its new entry at its next session, one being removed is stopped by
  whoever decodes it, who then says its decoder stopped;
* every lease tick (a third of the TTL), the leases are renewed and taken by the plan: each
  camera's owner is the live worker rendezvous hashing ranks highest among those with room
  for its weight (``pipeline.leases.placement``; what fits nowhere is reported unplaced);
  while no camera is leased yet (a fleet starting), a worker's first lease tick only joins, so
  that workers starting together plan with each other from the first camera on;
* then, from the leases' state (not from what the tick reported, which an outage can cut
  short): a camera this worker holds and does not decode yet first has the session of a
  decoder that died or was cut off ended, from its progress (the frames it put in Redis are
  then processed and counted, nothing invented), then a decoder of its own starts with a new
  session claimed under the lease (``streams.fence``); a camera decoded here that another
  worker holds now is abandoned (its decoder is fenced out already); a camera another worker
  now wins (it joined) is handed over: the decoder here stops cleanly, writes its end, and only
  then is the lease let go;
* a file camera is a job, done once: never handed over halfway, never started again once a
  session of it ended (``StreamKeys.decoded``), whatever ended it.

A worker ends once every registered camera is a file job that is done (by any worker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from pipeline.config import CameraConfig, Config
from pipeline.fleet.following import DETECTOR_SETTINGS, note_unapplied
from pipeline.fleet.registry import (
    CameraRegistry,
    RegistryFollower,
    differing,
    registry_probes,
)
from pipeline.leases.camera_leases import (
    DECODERS,
    CameraLeases,
    wait_for_worker_id,
    worker_lease_probes,
)
from pipeline.leases.placement import Placement, place
from pipeline.supervisor.decoders import DecoderSupervisor
from pipeline.supervisor.part import SLOW_TICK_S, Part
from pipeline.supervisor.services import Services
from streams.events import EventLog
from streams.fence import (
    DecodeLease,
    end_session_in_progress,
    end_sessions_in_progress,
    fence_probes,
    file_decoded,
)
from streams.redis_errors import OUTAGE_ERRORS

log = logging.getLogger(__name__)


def decode_lease(config: Config, worker_id: str) -> DecodeLease:
    return DecodeLease(worker_id, int(config.redis.lease_ttl_s * 1000))


def decode_probes(client: redis.Redis, key: str) -> list[tuple[str, Callable[[], object]]]:
    """What a decode worker runs beyond the daemon's commands: the registry, its leases, the
    fence (for the start-up check of the Redis user's rights)."""
    probes = registry_probes(client, key) + worker_lease_probes(client, key)
    return probes + fence_probes(client, key)


class ShardedDecoders(Part):
    """One decode worker's share of the registered cameras."""

    def __init__(
        self,
        config: Config,
        decoders: DecoderSupervisor,
        services: Services,
        *,
        lease: DecodeLease,
        capacity: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``capacity``: the most camera weight this worker takes (None: no limit)."""
        # a tick never waits out an outage: every call here fails fast, retried next tick
        self._registry = CameraRegistry(services.fail_fast, services.keys)
        self._follower = RegistryFollower(self._registry)  # every camera new at the first look
        self._decoders = decoders
        self._services = services
        self._client, self._keys = services.fail_fast, services.keys
        self._lease = lease
        self._leases = CameraLeases(
            services.fail_fast,
            services.keys,
            lease.worker,
            [],
            ttl_s=config.redis.lease_ttl_s,
            role=DECODERS,
            owner_of=self._plan,
        )
        self._capacity = capacity
        # the plan of the last lease tick, and the capacities it was made with
        self._planned: tuple[Placement, dict[str, float | None]] = (Placement({}, (), {}), {})
        self._clock = clock
        self._next_tick = 0.0
        self._cameras: dict[str, CameraConfig] = {}
        self._removing: set[str] = set()
        self._said_stopped: set[str] = set()
        self._done: set[str] = set()  # file jobs decoded, by any worker: competed for no more
        self._outage = False  # said once
        self._joined = False  # the first lease tick only joins (``_lease_tick``)

    @classmethod
    def joining(
        cls,
        config: Config,
        decoders: DecoderSupervisor,
        services: Services,
        *,
        lease: DecodeLease,
        capacity: float | None,
        stop: threading.Event,
    ) -> ShardedDecoders:
        """Once no running decode worker has this one's id (a restarted pod waits out its old
        heartbeat)."""
        wait_for_worker_id(
            services.client,
            services.keys,
            lease.worker,
            role=DECODERS,
            ttl_s=config.redis.lease_ttl_s,
            stop=stop,
        )
        return cls(config, decoders, services, lease=lease, capacity=capacity)

    # --- the supervisor's tick -----------------------------------------------------------------
    def tick(self) -> None:
        phases: list[tuple[str, float]] = []
        lease_tick, settle = ("leases", self._due_lease_tick), ("decoders", self._settle)
        try:
            _timed(phases, ("registry", self._follow), lease_tick, settle)
            if self._lease_tick_due():
                # settling took past the next lease tick (hundreds of decoders started on a
                # starved host): that tick runs now, and what it takes starts now, not after
                # the supervisor's other parts and its wait (0.3-0.5 s later on the fleet
                # bench, where it takes a worker's cameras SIGKILLed mid hand-back)
                _timed(phases, lease_tick, settle)
        except OUTAGE_ERRORS as exc:
            # the decoders ride it out (or are fenced out if it lasts past the TTL); the leases
            # are renewed, or lost, at the next tick that reaches Redis
            if not self._outage:
                log.warning("decode leases: Redis unreachable (%s); retrying each tick", exc)
            self._outage = True
            return
        if self._outage:
            log.info("decode leases: Redis reachable again")
            self._outage = False
        if sum(seconds for _, seconds in phases) > SLOW_TICK_S:
            log.warning(
                "decode worker tick: %s", ", ".join(f"{name} {s:.2f} s" for name, s in phases)
            )

    def _lease_tick_due(self) -> bool:
        return self._clock() >= self._next_tick

    def _due_lease_tick(self) -> None:
        if self._lease_tick_due():
            self._next_tick = self._clock() + self._leases.tick_s  # should this one fail
            self._lease_tick()
            self._next_tick = self._clock() + self._leases.next_tick_in()

    def done(self) -> bool:
        """Every registered camera is a file job, decoded (here or by another worker), and no
        decoder runs here."""
        if any(not self._is_file(c) for c in self._cameras) or not self._decoders.done():
            return False
        try:
            for camera in sorted(set(self._cameras) - self._done):
                if not file_decoded(self._client, self._keys, camera):
                    return False
                self._done.add(camera)
        except OUTAGE_ERRORS:
            return False
        return bool(self._cameras)

    def leave(self) -> None:
        """After the decoders here stopped and wrote their ends: out of the workers, every
        lease let go (the others take the cameras at their next tick, not after the TTL)."""
        try:
            self._leases.leave()
            self._client.hdel(self._keys.decode_capacity(), self._lease.worker)
        except OUTAGE_ERRORS as exc:
            log.warning("decode leases not let go (they run out in their TTL): %s", exc)

    def status(self) -> dict[str, Any]:
        """What ``/api/decoders`` answers (thread-safe: read from the last tick's plan)."""
        placement, capacities = self._planned
        return {
            "worker": self._lease.worker,
            "workers": {
                worker: {"capacity": capacities.get(worker), "load": load}
                for worker, load in sorted(placement.load.items())
            },
            "decoding": sorted(c for c, w in placement.owners.items() if w == self._lease.worker),
            "unplaced": list(placement.unplaced),
        }

    # --- inside --------------------------------------------------------------------------------
    def _follow(self) -> None:
        changes = self._follower.changes()
        for entry in changes.added + changes.changed:
            camera = entry.config
            before = self._cameras.get(camera.id)
            if before is None:
                self._leases.add_camera(camera.id)
            elif self._decoders.decoding(camera.id):  # a weight is planned with at once
                unapplied = differing(before, camera) - DETECTOR_SETTINGS - {"decode_weight"}
                note_unapplied(camera, unapplied)
            self._cameras[camera.id] = camera
            self._follower.applied(camera.id, entry.version)
        for entry in changes.removing:
            self._cameras.setdefault(entry.config.id, entry.config)
            self._leases.add_camera(entry.config.id)  # whoever holds it says it stopped
            self._removing.add(entry.config.id)
            self._follower.applied(entry.config.id, entry.version)
        for camera in changes.retired:
            if self._decoders.decoding(camera):
                self._decoders.remove(camera)
            self._leases.drop_camera(camera)
            for kept in (self._removing, self._said_stopped, self._done):
                kept.discard(camera)
            self._cameras.pop(camera, None)
            self._follower.forgot(camera)

    def _plan(self, workers: tuple[str, ...]) -> Callable[[str], str | None]:
        """The owner of each camera among ``workers`` (the live decode workers), weighed against
        their capacities; what no worker has room for is said once, and counted."""
        raw = self._client.hgetall(self._keys.decode_capacity())
        known = {_text(w): _text(c) for w, c in raw.items()}
        capacities = {w: _capacity(known.get(w, "")) for w in workers}
        weights = {
            c: self._cameras[c].decode_weight for c in self._leases.cameras if c in self._cameras
        }
        placement = place(weights, capacities)
        before = self._planned[0]
        for camera in sorted(set(placement.unplaced) - set(before.unplaced)):
            log.warning(
                "camera %s: no decode worker has room for it (weight %g; capacities %s): not "
                "decoded until one has",
                camera,
                weights[camera],
                ", ".join(
                    f"{w} {c if c is not None else 'unlimited'}" for w, c in capacities.items()
                ),
            )
        for camera in sorted(set(before.unplaced) - set(placement.unplaced)):
            if camera in placement.owners:
                log.info("camera %s: placed on decode worker %s", camera, placement.owner(camera))
        self._planned = placement, capacities  # one attribute: status() reads it whole
        return placement.owner

    def _lease_tick(self) -> None:
        capacity = "" if self._capacity is None else repr(self._capacity)
        self._client.hset(self._keys.decode_capacity(), self._lease.worker, capacity)
        if not self._joined:
            starting = not self._leases.any_held()
            self._joined = True
            if starting:
                # A fleet starting: this first lease tick only joins (as Kafka's
                # group.initial.rebalance.delay.ms), so that workers starting together (a
                # Deployment scaled from 0) all plan with each other from their first cameras
                # on.  Taking at once, 1,000 cameras over four workers started within 0.1 s
                # kept moving for 7 s after each was decoded somewhere: what the first workers
                # took, they handed over again, each a new session.  A worker joining a fleet
                # that runs (a pod restarted) takes its share at once: waiting a tick there
                # put a restarted worker's cameras back 0.7 s later.
                workers = self._leases.join()
                log.info(
                    "decode workers %s: joined; cameras taken from the next lease tick",
                    ", ".join(workers),
                )
                return
        changes = self._leases.tick()  # what it changed is settled from the leases' state
        if changes:
            log.info(
                "decode workers %s; this one decodes %d camera(s)",
                ", ".join(changes.workers),
                len(self._leases.held) + len(self._leases.handing_over),
            )

    def _settle(self) -> None:
        """Each camera brought to what the leases say, from their state (not only from what a
        tick reported: a tick an outage cut short reports nothing)."""
        mine = self._leases.held | self._leases.handing_over
        for camera in self._decoders.decoding_cameras():
            if camera not in mine:  # another worker's now: fenced out already
                log.warning("camera %s: no longer this worker's; its decoder stops", camera)
                self._decoders.abandon(camera)
        handed_over = []
        for camera in sorted(self._leases.handing_over):
            if self._is_file(camera) and camera not in self._done:
                self._run(camera)  # a file job is finished where it started
            elif self._decoders.decoding(camera):
                log.info("camera %s: another decode worker takes it; handing it over", camera)
                self._decoders.remove(camera)  # writes its end; the lease goes once it exited
            elif not self._decoders.known(camera) or not self._decoders.running(camera):
                handed_over.append(camera)
        self._leases.release_all(handed_over)
        for camera in handed_over:
            log.info("camera %s: handed over", camera)
        for camera in sorted(self._leases.held & self._removing):
            self._stop_removed(camera)
        self._start(sorted(self._leases.held - self._removing))
        for camera in sorted(self._removing - self._said_stopped):
            if camera in self._done:  # a file decoded: no decoder runs it anywhere
                self._registry.decoder_stopped(camera)
                self._said_stopped.add(camera)

    def _run(self, camera: str) -> None:
        self._start([camera])

    def _start(self, cameras: list[str]) -> None:
        """Decoders started for cameras held here and not decoded yet, the sessions their lost
        worker left ended first: all in a few round trips, so a worker taking over a lost
        host's hundreds of cameras starts them at once, not one after another."""
        ready = []
        for camera in cameras:
            if camera in self._done or self._decoders.decoding(camera):
                continue
            if self._decoders.known(camera) and self._decoders.running(camera):
                continue  # a decoder stopping (abandoned, handed over): its thread exits first
            if self._is_file(camera) and file_decoded(self._client, self._keys, camera):
                self._file_done(camera)
                continue
            ready.append(camera)
        if not ready:
            return
        started = time.monotonic()
        ended = end_sessions_in_progress(
            self._client,
            self._keys,
            ready,
            self._lease,
            lambda c: f"camera {c!r}: its decode worker was lost (died, or cut off past its lease)",
            final=self._is_file,
        )
        ended_in = time.monotonic() - started
        for camera, end in ended.items():
            log.warning(
                "camera %s: session %s of a decode worker lost ended at %d frames",
                camera,
                end.session,
                end.frames,
            )
        EventLog(self._client, self._keys).emit_each(
            [(camera, "crashed", end.error) for camera, end in ended.items()]
        )
        starting = []
        for camera in ready:
            if camera in ended:
                self._decoders.keep_end(camera, ended[camera].to_fields())
                if self._is_file(camera):
                    self._file_done(camera)
                    continue
            if self._services.states.state(camera) is None:  # this worker's cameras, in its API
                self._services.show_camera(self._cameras[camera])
            starting.append(self._cameras[camera])
            log.info("camera %s: decoded here from now (a new session)", camera)
        self._decoders.add_all(starting)
        log.info(
            "%d camera(s) started here in %.2f s (%d lost sessions ended in %.2f s)",
            len(ready),
            time.monotonic() - started,
            len(ended),
            ended_in,
        )

    def _stop_removed(self, camera: str) -> None:
        if self._decoders.decoding(camera):
            log.info("camera %s: being removed; its decoder stops", camera)
            self._decoders.remove(camera)
        if camera in self._said_stopped:
            return
        if self._decoders.known(camera) and self._decoders.running(camera):
            return
        message = f"camera {camera!r}: removed while its decode worker was lost"
        end_session_in_progress(self._client, self._keys, camera, self._lease, message, final=False)
        self._registry.decoder_stopped(camera)  # its stream's last entry is written
        self._said_stopped.add(camera)

    def _file_done(self, camera: str) -> None:
        self._done.add(camera)
        self._leases.drop_camera(camera)  # competed for no more

    def _is_file(self, camera: str) -> bool:
        config = self._cameras.get(camera)
        return config is not None and not (config.is_live or config.loop)


def _timed(phases: list[tuple[str, float]], *steps: tuple[str, Callable[[], None]]) -> None:
    """Each step run, and how long it took added to ``phases`` (a slow tick says where)."""
    for name, step in steps:
        started = time.monotonic()
        step()
        phases.append((name, time.monotonic() - started))


def _capacity(text: str) -> float | None:
    """A worker's registered capacity (empty: none; anything unreadable, from another
    version: taken as none, so its cameras are not left unplaced)."""
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
