"""The fence of a decoder sharded by lease (``framebatch decode``): every write of its session
(a frame with the session's progress, the progress alone, its end entry) first checks, in the
same atomic step, that the decoder may still write (a Lua script; for a frame, whose pixels
would cost Redis dearly through Lua, a WATCH/MULTI transaction), so a decode host that was cut
off, or paused, and whose cameras another host took over meanwhile, cannot add a frame behind
the next session's.

A write of session S by worker W goes through when

* the camera's decode lease is W's, or free (then it is W's again: nobody took the camera over,
  so nobody started another session), and
* the camera's progress hash names S (S's first write finds none).

Whoever takes a dead or cut-off decoder's camera over ends that decoder's session from its
progress (:func:`end_session_in_progress`), which deletes the progress: any later write of S is
then refused, and its decoder stops without a word more (:class:`LeaseLost`).  A file's session
that ends, however it ends, marks the file decoded (``StreamKeys.decoded``), with its end entry:
a file job is never decoded twice.  Every key is the camera's (one Cluster slot).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis

from streams.keys import StreamKeys
from streams.messages import EndOfStream, session_progress

#: KEYS: lease, progress: the lease's owner and the session in progress, looked at under WATCH
_LOOK = "return {redis.call('GET', KEYS[1]), redis.call('HGET', KEYS[2], 'session')}"

#: KEYS: lease, frames, progress, decoded; ARGV: worker, ttl ms, what ('progress', 'end'),
#: session, frames, redis_down, first ('1': the session has written nothing yet), final ('1': a
#: file job), then the end entry's field/value pairs.  Returns -1 refused, else 0 (or the
#: stream's length after a 'progress' write).
_WRITE = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return -1 end
local session = redis.call('HGET', KEYS[3], 'session')
if session ~= ARGV[4] and not (session == false and ARGV[7] == '1') then return -1 end
if not owner then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
if ARGV[3] == 'end' then
  redis.call('XADD', KEYS[2], '*', unpack(ARGV, 9))
  redis.call('DEL', KEYS[3])
  if ARGV[8] == '1' then redis.call('SET', KEYS[4], ARGV[4]) end
  return 0
end
redis.call('HSET', KEYS[3], 'session', ARGV[4], 'frames', ARGV[5], 'redis_down', ARGV[6])
return redis.call('XLEN', KEYS[2])
"""

#: KEYS: lease, frames, progress, decoded; ARGV: worker, ttl ms, session read ('': none),
#: final ('1'), then the end entry's field/value pairs.  Ends the session in progress, if it is
#: still the one read and the lease is this worker's (or free: taken): 1; else 0.
_END_IN_PROGRESS = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
if (redis.call('HGET', KEYS[3], 'session') or '') ~= ARGV[3] then return 0 end
if not owner then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5))
redis.call('DEL', KEYS[3])
if ARGV[4] == '1' then redis.call('SET', KEYS[4], ARGV[3]) end
return 1
"""

#: a decoder thread's exit report when it was fenced out: no end entry, and none is due from
#: its supervisor (the worker that took the camera over wrote it)
LEASE_LOST = "lease lost"

Fields = Mapping[str, str | int | float | bytes]


class LeaseLost(Exception):
    """The decoder's session was ended by the worker that took its camera over: it stops,
    writing nothing more."""


@dataclass(frozen=True)
class DecodeLease:
    """Which worker decodes a camera under lease (``DecoderSpec.lease``): what its writes
    carry for the fence."""

    worker: str
    ttl_ms: int


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
    """One decoder session's fenced writes (a file job's is ``final``)."""

    def __init__(
        self, client: redis.Redis, keys: StreamKeys, camera: str, lease: DecodeLease, *, final: bool
    ):
        self._script = client.register_script(_WRITE)
        self._camera = camera
        self._keys = _keys(keys, camera)
        self._lease = lease
        self._final = "1" if final else "0"
        self._written = False  # the session's first write may find no progress

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
                    pipe.multi()
                    if owner is None:  # it ran out, and nobody took the camera: ours again
                        pipe.set(lease, self._lease.worker, px=self._lease.ttl_ms)
                    pipe.xadd(stream, fields, maxlen=maxlen, approximate=False)
                    pipe.hset(progress_key, mapping=progress)
                    pipe.execute()
                except redis.WatchError:
                    continue  # renewed, or taken, meanwhile: looked at again
            self._written = True
            return

    def _check(self, owner: bytes | None, session: bytes | None, mine: str) -> None:
        if owner not in (None, self._lease.worker.encode()) or (
            session != mine.encode() and not (session is None and not self._written)
        ):
            raise self._lost(mine)

    def _lost(self, session: object) -> LeaseLost:
        return LeaseLost(
            f"camera {self._camera!r}: another decode worker took it over and ended session "
            f"{session}; this decoder stops"
        )

    def progress(self, client: redis.Redis, progress: Fields) -> int:
        """The session's progress alone; the stream's length."""
        return self._call(client, "progress", progress, {})

    def end(self, client: redis.Redis, end: EndOfStream) -> None:
        """The session's end entry; its progress deleted; a file job marked decoded."""
        progress = {"frames": end.frames, "redis_down": end.redis_down}
        self._call(client, "end", {"session": end.session, **progress}, end.to_fields())

    def _call(self, client: redis.Redis, what: str, progress: Fields, fields: Fields) -> int:
        first = "0" if self._written else "1"
        args = [
            self._lease.worker,
            self._lease.ttl_ms,
            what,
            progress["session"],
            progress["frames"],
            progress["redis_down"],
            first,
            self._final,
            *_pairs(fields),
        ]
        result = int(self._script(keys=self._keys, args=args, client=client))
        if result < 0:
            raise self._lost(progress["session"])
        self._written = True
        return result


def end_session_in_progress(
    client: redis.Redis,
    keys: StreamKeys,
    camera: str,
    lease: DecodeLease,
    message: str,
    *,
    final: bool,
    if_none: bool = False,
) -> EndOfStream | None:
    """Ends the session the camera's progress names (its decoder died, or was cut off and will
    be fenced out), as crashed, with the frames it counted; a file job is then decoded.  None
    when there is none to end (``if_none``: this worker's decoder died before its first frame;
    its end is written all the same, frames -1, as the daemon does), or the lease is another
    worker's."""
    script = client.register_script(_END_IN_PROGRESS)
    while True:
        progress = session_progress(client.hgetall(keys.progress(camera)))
        if progress is None and not if_none:
            return None
        session, frames, redis_down = progress or ("", -1, 0)
        end = EndOfStream(
            camera, frames, "crashed", message, session=session, redis_down=redis_down
        )
        args = [
            lease.worker,
            lease.ttl_ms,
            session,
            "1" if final else "0",
            *_pairs(end.to_fields()),
        ]
        if script(keys=_keys(keys, camera), args=args):
            return end
        if client.get(keys.decode_lease(camera)) not in (None, lease.worker.encode()):
            return None  # another worker's now: its to end
        # the session wrote again (alive, its lease free): read its progress again


def file_decoded(client: redis.Redis, keys: StreamKeys, camera: str) -> bool:
    """Whether a file camera's job is done (by any decode worker)."""
    return client.get(keys.decoded(camera)) is not None


def fence_probes(client: redis.Redis, key: str) -> list[tuple[str, Callable[[], object]]]:
    """(what, call) for the commands the fence's scripts run (GET, SET, HGET, HSET, XADD, XLEN,
    DEL), on probe keys under ``key``, for the start-up check of the Redis user's rights."""
    keys = StreamKeys(key)
    lease = DecodeLease("probe", 1000)
    fence = SessionFence(client, keys, "probe", lease, final=True)
    end = EndOfStream("probe", 0, "stopped", session="probe")
    return [
        ("EVALSHA (a decoder's fenced write)", lambda: fence.end(client, end)),
        (
            "EVALSHA (a lost decoder's session ended)",
            lambda: end_session_in_progress(client, keys, "probe", lease, "probe", final=True),
        ),
    ]
