"""The fence of a decoder sharded by lease (``framebatch decode``): a decoder writes only its
own session, and only while nobody took its camera over.

A session S is *claimed* before its decoder starts (:func:`claim_session`): by the worker W
that holds the camera's decode lease, only where no session is in progress (the camera's
progress hash is absent: the one before has its end entry) and, for a file, where the file is
not decoded yet; the claim writes the progress hash naming S.  Every write of S after that (a
frame with its progress, the progress alone, its end entry) first checks, in the same atomic
step (a Lua script; for a frame, whose pixels would cost Redis dearly through Lua, a WATCH/MULTI
transaction), that

* the progress still names S: nobody ended S (whoever takes a lost decoder's camera over ends
  its session from its progress, :func:`end_session_in_progress`, which deletes it), and
* the lease is W's, or free (it ran out while W was cut off and nobody took the camera: with
  the progress still S's, nobody started another session; W's again, unless W is gone:
  :class:`SessionFence`).

So a decode host that was cut off or paused, and whose cameras another host took over
meanwhile, adds nothing behind the next session's, even once the lease has come back to its
worker; its decoders stop without a word more (:class:`LeaseLost`).  A file's session that
ends, however it ends, marks the file decoded (``StreamKeys.decoded``) with its end entry: a
file job is never claimed again.  Every key is the camera's (one Cluster slot).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis
from redis.exceptions import ClusterDownError, TryAgainError

from streams.keys import StreamKeys
from streams.messages import EndOfStream, session_progress

log = logging.getLogger(__name__)

#: KEYS: lease, progress: the lease's owner and the session in progress, looked at under WATCH
_LOOK = "return {redis.call('GET', KEYS[1]), redis.call('HGET', KEYS[2], 'session')}"

#: KEYS: lease, frames, progress, decoded; ARGV: worker, ms a lease taken back lasts, what
#: ('progress', 'end'), session, frames, redis_down, final ('1': a file job), whether a free
#: lease may be taken back ('1': the decoder's worker lives), then the end entry's field/value
#: pairs.  Returns -1 refused (-2: the lease is free and may not be taken back), else 0 (or
#: the stream's length after a 'progress' write).
_WRITE = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[3], 'session') ~= ARGV[4] then return -1 end
if not owner then
  if ARGV[8] ~= '1' then return -2 end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if ARGV[3] == 'end' then
  redis.call('XADD', KEYS[2], '*', unpack(ARGV, 9))
  redis.call('DEL', KEYS[3])
  if ARGV[7] == '1' then redis.call('SET', KEYS[4], ARGV[4]) end
  return 0
end
redis.call('HSET', KEYS[3], 'session', ARGV[4], 'frames', ARGV[5], 'redis_down', ARGV[6])
return redis.call('XLEN', KEYS[2])
"""

#: KEYS: lease, progress, decoded; ARGV: worker, ttl ms, session, final ('1').  Claims a new
#: session: 1; 0 when the lease is another worker's, a session is in progress, or (final) the
#: file is decoded.
_CLAIM = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[2], 'session') then return 0 end
if ARGV[4] == '1' and redis.call('GET', KEYS[3]) then return 0 end
if not owner then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
redis.call('HSET', KEYS[2], 'session', ARGV[3], 'frames', '0', 'redis_down', '0')
return 1
"""

#: KEYS: lease, frames, progress, decoded; ARGV: worker, ttl ms, session read, final ('1'),
#: then the end entry's field/value pairs.  Ends the session in progress, if it is still the
#: one read and the lease is this worker's (or free: taken): 1; else 0.
_END_IN_PROGRESS = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[3], 'session') ~= ARGV[3] then return 0 end
if not owner then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5))
redis.call('DEL', KEYS[3])
if ARGV[4] == '1' then redis.call('SET', KEYS[4], ARGV[3]) end
return 1
"""

#: KEYS[1] lease; ARGV: worker id.  Lets go of one's own lease only (a worker's hand-over and
#: leave, ``pipeline.leases.camera_leases``; a dead decode worker's :func:`leave_for_dead_worker`).
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

ORPHANED = -2  # :data:`_WRITE`'s answer when the lease ran out and its worker is gone

#: a decoder thread's exit report when its worker was gone (:class:`WorkerGone`): no end
#: entry, its session still in progress
WORKER_GONE = "decode worker gone"
#: a decoder thread's exit report when it was fenced out: no end entry, and none is due from
#: its supervisor (the worker that took the camera over wrote it)
LEASE_LOST = "lease lost"

Fields = Mapping[str, str | int | float | bytes]


class LeaseLost(Exception):
    """The decoder's session was ended by the worker that took its camera over: it stops,
    writing nothing more."""


class WorkerGone(LeaseLost):
    """The decoder's worker is gone (or stopping it) and the lease ran out: it stops, writing
    nothing more; its session is left in progress, for whoever holds the lease next to end
    (its own worker, should it still be there to read the exit: ``WORKER_GONE``)."""


@dataclass(frozen=True)
class DecodeLease:
    """Which worker decodes a camera under lease (``DecoderSpec.lease``): what its writes
    carry for the fence."""

    worker: str
    ttl_ms: int

    @property
    def taken_back_ms(self) -> int:
        """How long a lease a decoder takes back lasts: a tick of its worker (a third of the
        TTL, at most 1 s: ``CameraLeases.tick_s``), whose tick then renews it whole."""
        return max(1, min(self.ttl_ms // 3, 1000))


def _pairs(fields: Fields) -> list[str | int | float | bytes]:
    return [item for pair in fields.items() for item in pair]


def _keys(keys: StreamKeys, camera: str) -> list[str]:
    return [
        keys.decode_lease(camera),
        keys.frames(camera),
        keys.progress(camera),
        keys.decoded(camera),
    ]


class SessionFence:
    """One decoder session's fenced writes (a file job's is ``final``).

    A lease that ran out with nobody taking the camera is taken back by the next write, but
    only while ``worker_alive()``, and for a tick of the worker (``taken_back_ms``), which
    renews it from then on.  A decoder whose worker died (a decode process outlives a
    SIGKILLed worker by a moment) takes it back no more: the lease would hold the camera
    another TTL with nobody renewing it, and the worker that wins the camera would wait that
    out.  A decoder thread starved between its look and its write may still take it back
    after its worker died unseen (seen: 2 s on a saturated host): for a tick at most."""

    def __init__(
        self,
        client: redis.Redis,
        keys: StreamKeys,
        camera: str,
        lease: DecodeLease,
        *,
        final: bool,
        worker_alive: Callable[[], bool] = lambda: True,
    ):
        self._script = client.register_script(_WRITE)
        self._camera = camera
        self._keys = _keys(keys, camera)
        self._lease = lease
        self._final = "1" if final else "0"
        self._worker_alive = worker_alive

    def frame(
        self, client: redis.Redis, fields: Fields, progress: Fields, maxlen: int | None
    ) -> None:
        """The frame entry (MAXLEN exact when given) and the session's progress, in a
        transaction that runs only if neither the lease nor the progress moved since they were
        looked at.  Not the script: a frame's pixels passed through Lua cost Redis 15x the CPU
        of the XADD itself (docs/benchmarks.md)."""
        lease, stream, progress_key = self._keys[:3]
        while True:
            with client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(lease, progress_key)
                    owner, session = pipe.execute_command("EVAL", _LOOK, 2, lease, progress_key)
                    self._check(owner, session, str(progress["session"]))
                    if owner is None and not self._worker_alive():
                        raise self._orphaned(progress["session"])
                    pipe.multi()
                    if owner is None:  # it ran out, and nobody took the camera: ours again
                        pipe.set(lease, self._lease.worker, px=self._lease.taken_back_ms)
                    pipe.xadd(stream, fields, maxlen=maxlen, approximate=False)
                    pipe.hset(progress_key, mapping=progress)
                    pipe.execute()
                except redis.WatchError:
                    continue  # renewed, or taken, meanwhile: looked at again
                except (ClusterDownError, TryAgainError) as error:
                    # a cluster going down under WATCH and the look, which run outside the
                    # pipeline's riding out: said as the outage it is, so a live camera sheds
                    # its frames meanwhile (it used to crash its decoder into a restart backoff)
                    raise redis.ConnectionError(f"Redis Cluster unreachable: {error}") from error
            return

    def _check(self, owner: bytes | None, session: bytes | None, mine: str) -> None:
        if owner not in (None, self._lease.worker.encode()) or session != mine.encode():
            raise self._lost(mine)

    def _lost(self, session: object) -> LeaseLost:
        return LeaseLost(
            f"camera {self._camera!r}: another decode worker took it over and ended session "
            f"{session}; this decoder stops"
        )

    def _orphaned(self, session: object) -> WorkerGone:
        return WorkerGone(
            f"camera {self._camera!r}: its decode worker is gone and its lease ran out; session "
            f"{session} is left for the worker that takes the camera over to end"
        )

    def progress(self, client: redis.Redis, progress: Fields) -> int:
        """The session's progress alone; the stream's length."""
        return self._call(client, "progress", progress, {})

    def end(self, client: redis.Redis, end: EndOfStream) -> None:
        """The session's end entry; its progress deleted; a file job marked decoded."""
        progress = {"frames": end.frames, "redis_down": end.redis_down}
        self._call(client, "end", {"session": end.session, **progress}, end.to_fields())

    def _call(self, client: redis.Redis, what: str, progress: Fields, fields: Fields) -> int:
        args = [
            self._lease.worker,
            self._lease.taken_back_ms,
            what,
            progress["session"],
            progress["frames"],
            progress["redis_down"],
            self._final,
            "1" if self._worker_alive() else "0",
            *_pairs(fields),
        ]
        result = int(self._script(keys=self._keys, args=args, client=client))
        if result == ORPHANED:
            raise self._orphaned(progress["session"])
        if result < 0:
            raise self._lost(progress["session"])
        return result


@dataclass(frozen=True)
class SessionClaim:
    """A session to claim for a decoder about to start."""

    camera: str
    session: str
    final: bool  # a file job: decoded once, whatever ends it


def claim_sessions(
    client: redis.Redis, keys: StreamKeys, lease: DecodeLease, claims: list[SessionClaim]
) -> dict[str, bool]:
    """Claims each session for a decoder about to start (see the module's docstring), all in
    one pipeline (a round trip per node on a cluster: a worker taking over a lost host's
    hundreds of cameras took a round trip each, seconds on a starved host, its lease renewals
    waiting behind them).  False for a camera whose lease is another worker's, whose session
    is still in progress (end it first), or whose file is decoded; and for one whose claim
    met an error (a node refusing it), which is logged: the camera is tried again at the
    next tick, not the others with it."""
    pipe = client.pipeline(transaction=False)
    for claim in claims:
        claim_keys = [
            keys.decode_lease(claim.camera),
            keys.progress(claim.camera),
            keys.decoded(claim.camera),
        ]
        args = [lease.worker, lease.ttl_ms, claim.session, "1" if claim.final else "0"]
        # EVAL as a plain command: a cluster's pipeline has no eval() of its own
        pipe.execute_command("EVAL", _CLAIM, len(claim_keys), *claim_keys, *args)
    answers = pipe.execute(raise_on_error=False) if claims else []
    claimed = {}
    for claim, answer in zip(claims, answers, strict=True):
        failed = isinstance(answer, Exception)
        if failed:
            log.warning("camera %s: session not claimed (%s); tried again", claim.camera, answer)
        claimed[claim.camera] = not failed and bool(answer)
    return claimed


def claim_session(
    client: redis.Redis,
    keys: StreamKeys,
    camera: str,
    lease: DecodeLease,
    session: str,
    *,
    final: bool,
) -> bool:
    """:func:`claim_sessions` for one camera."""
    return claim_sessions(client, keys, lease, [SessionClaim(camera, session, final)])[camera]


def end_session_in_progress(
    client: redis.Redis,
    keys: StreamKeys,
    camera: str,
    lease: DecodeLease,
    message: str,
    *,
    final: bool,
    session: str | None = None,
) -> EndOfStream | None:
    """Ends the session the camera's progress names (its decoder died, or was cut off and will
    be fenced out), as crashed, with the frames it counted; a file job is then decoded.
    ``session``: only that one (a decoder of this worker that died), not another that has
    started since.  None when there is none to end, or the lease is another worker's."""
    script = client.register_script(_END_IN_PROGRESS)
    while True:
        progress = session_progress(client.hgetall(keys.progress(camera)))
        if progress is None or (session is not None and progress[0] != session):
            return None
        found, frames, redis_down = progress
        end = EndOfStream(camera, frames, "crashed", message, session=found, redis_down=redis_down)
        args = [lease.worker, lease.ttl_ms, found, "1" if final else "0", *_pairs(end.to_fields())]
        if script(keys=_keys(keys, camera), args=args):
            return end
        if client.get(keys.decode_lease(camera)) not in (None, lease.worker.encode()):
            return None  # another worker's now: its to end
        # the session wrote again (alive, its lease free): read its progress again


def end_sessions_in_progress(
    client: redis.Redis,
    keys: StreamKeys,
    cameras: list[str],
    lease: DecodeLease,
    message: Callable[[str], str],
    *,
    final: Callable[[str], bool],
) -> dict[str, EndOfStream]:
    """:func:`end_session_in_progress` for many cameras (a worker taking over a lost one's):
    their progress read in one pipeline, their sessions ended in another; a camera whose end
    was refused (its session wrote again, or its lease is taken) is tried again alone.  The
    sessions ended, by camera."""
    pipe = client.pipeline(transaction=False)
    for camera in cameras:
        pipe.hgetall(keys.progress(camera))
    found: dict[str, EndOfStream] = {}
    for camera, fields in zip(cameras, pipe.execute(), strict=True):
        progress = session_progress(fields)
        if progress is not None:
            session, frames, redis_down = progress
            found[camera] = EndOfStream(
                camera, frames, "crashed", message(camera), session=session, redis_down=redis_down
            )
    pipe = client.pipeline(transaction=False)
    for camera, end in found.items():
        flag = "1" if final(camera) else "0"
        args = [lease.worker, lease.ttl_ms, end.session, flag, *_pairs(end.to_fields())]
        # EVAL as a plain command: a cluster's pipeline has no eval() of its own
        pipe.execute_command("EVAL", _END_IN_PROGRESS, 4, *_keys(keys, camera), *args)
    ended: dict[str, EndOfStream] = {}
    for (camera, end), done in zip(found.items(), pipe.execute(), strict=True):
        if not done:  # refused: its session wrote again, or the lease is another's now
            end = end_session_in_progress(
                client, keys, camera, lease, message(camera), final=final(camera)
            )
        if end is not None:
            ended[camera] = end
    return ended


def leave_for_dead_worker(
    client: redis.Redis, keys: StreamKeys, worker: str, cameras: list[str]
) -> int:
    """A decode worker's last will, left by its decode processes once it died (SIGKILLed, a
    crash, the OOM killer), as their decoders are told to stop: the leases of ``cameras`` held in
    its name let go and its heartbeat dropped, so the worker that wins each camera takes it at
    its next tick instead of waiting out the TTL.  Each of its processes leaves it for its own
    cameras (one pipeline); the rest run out as before.  Not for a host lost whole or cut
    off: no process is left there to say so.

    A worker restarted under the same id while its old processes still leave (a second or
    two after the kill) may see a lease of its own let go once: its next tick, or its
    decoder's next write, takes it back (a decoder's writes are fenced: nothing is written
    twice).  The number of leases let go."""
    pipe = client.pipeline(transaction=False)
    for camera in cameras:
        # EVAL, not EVALSHA: redis-py's cluster pipelines refuse EVALSHA
        pipe.execute_command("EVAL", RELEASE_LEASE, 1, keys.decode_lease(camera), worker)
    pipe.zrem(keys.decode_workers(), worker)
    *released, _dropped = pipe.execute()
    return sum(int(answer) for answer in released)


def file_decoded(client: redis.Redis, keys: StreamKeys, camera: str) -> bool:
    """Whether a file camera's job is done (by any decode worker)."""
    return client.get(keys.decoded(camera)) is not None


_probe_progress = {"session": "probe", "frames": 1, "redis_down": 0}


def fence_probes(client: redis.Redis, key: str) -> list[tuple[str, Callable[[], object]]]:
    """(what, call) for the commands the fence runs (WATCH, EVAL, MULTI, EXEC; in its scripts
    GET, SET, HGET, HSET, XADD, XLEN, DEL), on probe keys under ``key``, for the start-up check
    of the Redis user's rights."""
    keys = StreamKeys(key)
    lease = DecodeLease("probe", 1000)
    fence = SessionFence(client, keys, "probe", lease, final=True)
    end = EndOfStream("probe", 0, "stopped", session="probe")
    return [
        (
            "EVAL (a decoder's session claimed)",
            lambda: claim_session(client, keys, "probe", lease, "probe", final=True),
        ),
        (
            "WATCH, EVAL, MULTI (a decoder's fenced frame)",
            lambda: fence.frame(client, {"probe": 1}, _probe_progress, None),
        ),
        ("EVALSHA (a decoder's fenced write)", lambda: fence.end(client, end)),
        (
            "EVALSHA (a lost decoder's session ended)",
            lambda: end_session_in_progress(client, keys, "probe", lease, "probe", final=True),
        ),
    ]
