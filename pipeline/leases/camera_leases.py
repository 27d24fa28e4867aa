"""Camera leases: which detector worker reads which camera, and which decode worker decodes
it, across processes and hosts (each role its own workers and leases: :data:`DETECTORS`,
:data:`DECODERS`).

Workers register in one sorted set, each scored by when its heartbeat runs out (Redis's
own clock: the hosts' clocks never matter).  A camera's owner is chosen among the live workers
by rendezvous (highest random weight) hashing, so a worker joining takes only the cameras it
now wins and a worker leaving frees only its own (about 1/n of them each time), and it is held
through a lease key with a TTL.  A worker that stops renewing (killed, cut off) loses its
cameras when the TTL runs out; the next tick of the worker that wins them takes them over.

A camera that another worker now wins is handed over, not dropped: its owner stops reading it,
finishes the frames it holds, and only then lets the lease go (:meth:`CameraLeases.release`).
Every command touches one key, so leases work on Redis Cluster.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

import redis

from pipeline.errors import BadInput
from pipeline.ledger.acks import FENCED_POSITION
from streams.fence import RELEASE_LEASE
from streams.keys import StreamKeys
from streams.redis_cluster import server_time_ms

log = logging.getLogger(__name__)

VALID_SHARE = 0.8  # of the TTL: how long after a renewal was sent the leases are trusted
#: of the TTL: how long after a renewal was sent the leases are surely still in Redis (a
#: margin for the two clocks' rates); one renewed later may have run out and been taken meanwhile
HELD_SHARE = 0.95

#: of a second: how long after another worker's heartbeat ran out this one's next tick comes
#: (its leases ran out with it; the margin covers a Cluster's nodes' clocks)
RUN_OUT_MARGIN_S = 0.1

#: KEYS[1] workers zset; ARGV: ttl ms, worker id.  Drops the workers whose heartbeat ran out,
#: renews this one's, and returns whether it was absent (1: added, 0: renewed), in how many ms
#: the first other live worker's heartbeat runs out (-1: there is none), then the live workers.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local added = redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local reply, soonest = {added, -1}, nil
for i = 1, #live, 2 do
  table.insert(reply, live[i])
  local score = tonumber(live[i + 1])
  if live[i] ~= ARGV[2] and (not soonest or score < soonest) then soonest = score end
end
if soonest then reply[2] = soonest - now end
return reply
"""
#: KEYS[1] workers zset; ARGV: ttl ms, worker id.  The heartbeat pushed on again once the
#: leases are renewed, if the worker is still there: it runs out after them, so a worker that
#: sees it ran out finds the leases free (and ticks then: ``CameraLeases.next_tick_in``).  On
#: one Redis; on a Cluster the renewals on other nodes may land a moment later (each node's
#: batch of the pipeline apart, their clocks apart): a lease still held then is taken at the
#: next regular tick, as without it.
_BEAT_AFTER_RENEWALS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[2])
"""
#: KEYS[1] lease; ARGV: worker id, ttl ms.  Takes a free lease or renews one's own: 1, else 0.
_HOLD = """
local owner = redis.call('GET', KEYS[1])
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


def new_worker_id() -> str:
    """A worker's name in the leases (and a detector's in the consumer group): unique per
    process."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def rendezvous_owner(camera: str, workers: Iterable[str]) -> str | None:
    """The worker with the highest weight for this camera (None when there is none)."""
    return max(workers, key=lambda worker: _weight(worker, camera), default=None)


def rendezvous_rank(camera: str, workers: Iterable[str]) -> list[str]:
    """The workers in the order this camera prefers them (the first is its owner)."""
    return sorted(workers, key=lambda worker: _weight(worker, camera), reverse=True)


def _weight(worker: str, camera: str) -> tuple[int, str]:
    digest = hashlib.blake2b(f"{worker}\0{camera}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big"), worker  # the id breaks a (2^-64) tie


@dataclass(frozen=True)
class LeaseRole:
    """Which workers share the cameras: where they register, and each camera's lease."""

    workers: Callable[[StreamKeys], str]
    lease: Callable[[StreamKeys, str], str]
    name: str


DETECTORS = LeaseRole(StreamKeys.workers, StreamKeys.lease, "detector")
DECODERS = LeaseRole(StreamKeys.decode_workers, StreamKeys.decode_lease, "decode")


@dataclass(frozen=True)
class LeaseChanges:
    """What one tick decided for this worker."""

    gained: tuple[str, ...] = ()  # now ours: claim their pending frames, then read them
    lost: tuple[str, ...] = ()  # taken by another worker already: stop at once
    handing_over: tuple[str, ...] = ()  # another worker wins them: stop reading, finish, release
    workers: tuple[str, ...] = ()  # the live workers

    def __bool__(self) -> bool:
        return bool(self.gained or self.lost or self.handing_over)


@dataclass
class CameraLeases:
    """One worker's leases.  ``tick()`` every ``tick_s`` (a third of the TTL or
    less), from one thread."""

    redis_client: redis.Redis
    keys: StreamKeys
    worker_id: str
    cameras: list[str]
    ttl_s: float = 5.0
    role: LeaseRole = DETECTORS
    #: who owns each camera among the live workers given (default: rendezvous hashing); the
    #: decoders' plan weighs the cameras against the workers' capacities
    #: (``pipeline.leases.placement``)
    owner_of: Callable[[tuple[str, ...]], Callable[[str], str | None]] | None = None
    held: set[str] = field(default_factory=set)
    handing_over: set[str] = field(default_factory=set)  # held until release()
    clock: Callable[[], float] = time.monotonic
    #: until when (``clock``) the leases held are surely still this worker's: the TTL counted
    #: from before the last renewal was sent, less a margin for the two clocks' rates
    valid_until: float = float("-inf")
    held_until: float = float("-inf")  # until when they are surely still in Redis
    renewed_at: float = float("inf")  # when the last tick was sent (none yet: never late)
    #: held again by the last tick, whose renewal came when their leases may have run out:
    #: another worker may have taken them, read on and let go meanwhile (``LeaseKeeper``
    #: looks; a decoder's frames are fenced by its session's claim instead)
    retaken: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._beat_at: float | None = None  # when the last heartbeat was sent
        # when (``clock``) the first other live worker's heartbeat runs out, as last seen
        self._others_run_out_at = float("inf")
        self._heartbeat = self.redis_client.register_script(_HEARTBEAT)

    @property
    def tick_s(self) -> float:
        """A lost camera moves within the TTL and one tick of the worker that wins it."""
        return min(self.ttl_s / 3, 1.0)

    def next_tick_in(self) -> float:
        """Seconds until the next tick is due: ``tick_s`` after the last one started, or as
        soon as another worker's heartbeat runs out (a dead worker's cameras are taken then,
        not up to a tick later), but not sooner than a fifth of ``tick_s`` after it."""
        now = self.clock()
        last = min(self.renewed_at, now)
        soonest = max(self._others_run_out_at + RUN_OUT_MARGIN_S, last + self.tick_s / 5)
        return min(last + self.tick_s, soonest) - now

    @property
    def _ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)

    def tick(self) -> LeaseChanges:
        """Heartbeat, renew what is held, take what this worker wins and is free.

        A camera whose lease call met an error (a node failing over, a timeout) stays as it
        was, and the first such error is raised once the others are settled."""
        sent = self.clock()
        self.retaken = set()
        if sent - self.renewed_at > self.ttl_s / 2:
            log.warning(
                "%s leases: renewed %.1f s after the last renewal (TTL %g s): a starved host "
                "or a stalled tick; past the TTL, the other workers take its cameras",
                self.role.name,
                sent - self.renewed_at,
                self.ttl_s,
            )
        self.renewed_at = sent
        workers, forgotten = self._beat(sent)
        gained, lost, handing_over = [], [], []
        mine = self.held | self.handing_over
        if forgotten is not None:
            # Redis no longer had this worker (restarted without its data, a replica promoted
            # before it had the heartbeats, or an outage or a cut past the TTL) and maybe not
            # the others: the workers seen are those that beat since, so planning with them,
            # the first to tick took every camera whose holder had not renewed yet, for the
            # holders to lose, each a new session.  Each renews what it holds; all plan with
            # all from the next tick.
            log.warning(
                "%s leases: Redis no longer had this worker's heartbeat (sent %.1f s before, "
                "TTL %g s): renewing the %d camera(s) held, taking none until the other "
                "workers are back",
                self.role.name,
                sent - forgotten,
                self.ttl_s,
                len(mine),
            )
            wins = set(mine)
        else:
            owner = (
                self.owner_of(workers)
                if self.owner_of
                else partial(rendezvous_owner, workers=workers)
            )
            wins = {camera for camera in self.cameras if owner(camera) == self.worker_id}
        answers = self._hold_leases([c for c in self.cameras if c in mine or c in wins])
        lapsed = self.clock() >= self.held_until  # the renewal arrived at the latest now
        for camera, answer in answers.items():
            if isinstance(answer, Exception):
                continue
            if camera in mine:
                if not answer:
                    lost.append(camera)
                    self.held.discard(camera)
                    self.handing_over.discard(camera)
                    continue
                if lapsed:
                    self.retaken.add(camera)
                if camera not in wins and camera in self.held:
                    handing_over.append(camera)
                    self.held.discard(camera)
                    self.handing_over.add(camera)
            elif answer:
                gained.append(camera)
                self.held.add(camera)
        if self.retaken:
            log.warning(
                "%s leases: %d renewed only %.1f s after the last renewal went out (TTL %g s): "
                "they may have run out meanwhile",
                self.role.name,
                len(self.retaken),
                self.clock() - (self.held_until - self.ttl_s * HELD_SHARE),
                self.ttl_s,
            )
        _raise_first_error(answers)
        self._renewed(sent)
        return LeaseChanges(tuple(gained), tuple(lost), tuple(handing_over), workers)

    def join(self) -> tuple[str, ...]:
        """Heartbeat only, taking nothing: the other workers see this one and plan with it
        (hand over what it wins) before it takes anything; returns the live workers."""
        return self._beat(self.clock())[0]

    def _beat(self, sent: float) -> tuple[tuple[str, ...], float | None]:
        """The heartbeat, sent at ``sent``: the live workers, and, when Redis no longer had
        this worker although it had beaten before, when that last heartbeat went out (None
        otherwise).  Not only while that one was surely in force: a decode worker's calls
        fail fast through an outage, so after one longer than the TTL its last heartbeat is
        old, and Redis may have come back without anybody's."""
        self._others_run_out_at = float("inf")  # unknown unless this heartbeat answers
        added, soonest_ms, *live = self._heartbeat(
            keys=[self.role.workers(self.keys)], args=[self._ttl_ms, self.worker_id]
        )
        if soonest_ms >= 0:
            self._others_run_out_at = self.clock() + soonest_ms / 1000
        last, self._beat_at = self._beat_at, sent
        return tuple(w.decode() for w in live), last if added and last is not None else None

    def any_held(self) -> bool:
        """Whether any worker holds any of the cameras' leases (one pipeline: a round trip
        per node on a cluster; GET, which a worker's Redis user may run already)."""
        pipe = self.redis_client.pipeline(transaction=False)
        for camera in self.cameras:
            pipe.get(self.role.lease(self.keys, camera))
        return any(held is not None for held in pipe.execute()) if self.cameras else False

    def valid(self) -> bool:
        """Whether this worker may read its cameras now (not while a renewal is overdue: a
        worker cut off from Redis must not read on once its leases may have run out)."""
        return self.clock() < self.valid_until

    def renew(self) -> None:
        """Heartbeat and renew what is held, taking nothing new (a worker that is stopping
        keeps its cameras while it finishes their frames)."""
        sent = self.clock()
        self._beat(sent)
        answers = self._hold_leases(sorted(self.held | self.handing_over))
        for camera, answer in answers.items():
            if not isinstance(answer, Exception) and not answer:
                self.held.discard(camera)
                self.handing_over.discard(camera)
        _raise_first_error(answers)
        self._renewed(sent)

    def _renewed(self, sent: float) -> None:
        """Every lease held was renewed by calls sent at ``sent`` (they set the TTL when they
        arrived, later)."""
        self.valid_until = sent + self.ttl_s * VALID_SHARE
        self.held_until = sent + self.ttl_s * HELD_SHARE

    def add_camera(self, camera: str) -> None:
        """A camera registered while the worker runs: competed for from the next tick."""
        if camera not in self.cameras:
            self.cameras.append(camera)

    def drop_camera(self, camera: str) -> None:
        """A camera retired from the registry: never taken again; its lease, if held, let go
        (its frames are all finished: retiring waits for that)."""
        if camera in self.cameras:
            self.cameras.remove(camera)
        if camera in self.held or camera in self.handing_over:
            self.release(camera)

    def _hold_leases(self, cameras: list[str]) -> dict[str, bool | Exception]:
        """Takes (free) or renews (this worker's) each camera's lease: whether it is this
        worker's now, or the error its call met.  One pipeline (a round trip per node on a
        cluster), not a round trip a camera: a decode worker holding 300 cameras, its threads
        contending for the interpreter on a starved host, took seconds a tick so, its
        heartbeat ran out, and the cameras churned between the live workers."""
        pipe = self.redis_client.pipeline(transaction=False)
        for camera in cameras:
            lease = self.role.lease(self.keys, camera)
            # EVAL, not EVALSHA: redis-py's cluster pipelines refuse EVALSHA
            pipe.execute_command("EVAL", _HOLD, 1, lease, self.worker_id, self._ttl_ms)
        if not cameras:
            return {}
        workers = self.role.workers(self.keys)
        pipe.execute_command("EVAL", _BEAT_AFTER_RENEWALS, 1, workers, self._ttl_ms, self.worker_id)
        *answers, beat = pipe.execute(raise_on_error=False)
        if isinstance(beat, Exception):  # only this tick's look at the others' heartbeats
            log.debug("%s heartbeat after the renewals not sent: %s", self.role.name, beat)
        return {
            camera: answer if isinstance(answer, Exception) else bool(answer)
            for camera, answer in zip(cameras, answers, strict=True)
        }

    def release(self, camera: str) -> None:
        """A handed-over camera's frames are all finished: its next owner may take it."""
        self.release_all([camera])

    def release_all(self, cameras: Iterable[str]) -> None:
        """:meth:`release` for each, in one pipeline (a round trip per node on a cluster): a
        decode worker letting go of 46 cameras one round trip each took 0.9 s of its tick
        on a starved host, and the cameras it was taking waited behind them.  A call that
        fails raises its error once every other was sent (that lease runs out in its TTL)."""
        cameras = sorted(set(cameras))
        if not cameras:
            return
        pipe = self.redis_client.pipeline(transaction=False)
        for camera in cameras:
            self.handing_over.discard(camera)
            self.held.discard(camera)
            # EVAL, not EVALSHA: redis-py's cluster pipelines refuse EVALSHA
            pipe.execute_command(
                "EVAL", RELEASE_LEASE, 1, self.role.lease(self.keys, camera), self.worker_id
            )
        for answer in pipe.execute(raise_on_error=False):
            if isinstance(answer, Exception):
                raise answer

    def leave(self) -> None:
        """Stopping: out of the workers, every lease let go (the others take over at their
        next tick, not after the TTL)."""
        self.redis_client.zrem(self.role.workers(self.keys), self.worker_id)
        self.release_all(self.held | self.handing_over)


def _raise_first_error(answers: dict[str, bool | Exception]) -> None:
    for answer in answers.values():
        if isinstance(answer, Exception):
            raise answer


def worker_alive(
    client: redis.Redis, keys: StreamKeys, worker_id: str, role: LeaseRole = DETECTORS
) -> bool:
    """Whether a worker with this id has a heartbeat in force (two processes under one id
    would both hold every lease of it)."""
    expires = client.zscore(role.workers(keys), worker_id)
    if expires is None:
        return False
    return expires > server_time_ms(client, role.workers(keys))


def wait_for_worker_id(
    client: redis.Redis,
    keys: StreamKeys,
    worker_id: str,
    *,
    role: LeaseRole,
    ttl_s: float,
    stop: threading.Event,
) -> None:
    """Returns once no running worker has this id: the same id restarted (a pod's container)
    waits out its old heartbeat; BadInput if one that is still renewed holds it."""
    deadline = time.monotonic() + ttl_s + 1
    while worker_alive(client, keys, worker_id, role) and time.monotonic() < deadline:
        if stop.wait(0.25):
            break  # stopped meanwhile: the id's owner is judged now
    if worker_alive(client, keys, worker_id, role):
        raise BadInput(
            f"worker id {worker_id!r} is in use by a running {role.name} worker: give each "
            "worker its own --worker-id"
        )


def lease_probes(client: redis.Redis, key: str) -> list[tuple[str, Callable[[], object]]]:
    """(what, call) for the commands a detector worker's leases run (in scripts: ZADD,
    ZRANGE, ZREMRANGEBYSCORE, TIME, GET, SET, PEXPIRE, DEL, HGET, HSET; ZREM, ZSCORE; and EVAL
    for the position's script in a transaction), on probe keys under ``key``, for the start-up
    check of the Redis user's rights."""
    position = ("EVAL (the camera's position)", lambda: _position_script(client, key))
    return [*worker_lease_probes(client, key), position]


def worker_lease_probes(client: redis.Redis, key: str) -> list[tuple[str, Callable[[], object]]]:
    """The probes of what the leases of either role run (:func:`lease_probes`)."""
    heartbeat = client.register_script(_HEARTBEAT)
    release = client.register_script(RELEASE_LEASE)
    workers, lease = f"{key}:workers", f"{key}:lease"
    beat_again = ("EVAL (heartbeat after the renewals)", _BEAT_AFTER_RENEWALS, 1, workers, 1000)
    return [
        ("EVALSHA (worker heartbeat)", lambda: heartbeat(keys=[workers], args=[1000, "probe"])),
        (beat_again[0], lambda: client.execute_command("EVAL", *beat_again[1:], "probe")),
        ("EVAL (camera lease)", lambda: client.eval(_HOLD, 1, lease, "probe", 1000)),
        ("EVALSHA (lease release)", lambda: release(keys=[lease], args=["probe"])),
        ("ZREM", lambda: client.zrem(workers, "probe")),
        ("ZSCORE", lambda: client.zscore(workers, "probe")),
    ]


def _position_script(client: redis.Redis, key: str) -> None:
    pipe = client.pipeline(transaction=True)
    keys = (f"{key}:cursor", f"{key}:lease")
    # a position with a stream id: the script reads the kept one's (HGET) before writing
    pipe.execute_command("EVAL", FENCED_POSITION, 2, *keys, "probe", "entry_id", "1-0")
    pipe.execute()
