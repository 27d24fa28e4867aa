"""The fence of decoders sharded by lease, on a real redis-server: a decoder whose camera
another worker took over writes nothing more, even when the lease is free again or back with
its own worker, even if it never wrote before; a decoder cut off while nobody took its camera
writes on, unless its worker is gone; a session is claimed only where none is in progress,
and ended once; a file's session that ends marks the file decoded, never claimed again; the
roles' leases never mix."""

from __future__ import annotations

import pytest
import redis

from pipeline.leases.camera_leases import DECODERS, CameraLeases
from streams.fence import (
    DecodeLease,
    LeaseLost,
    SessionClaim,
    SessionFence,
    WorkerGone,
    claim_session,
    claim_sessions,
    end_session_in_progress,
    end_sessions_in_progress,
    file_decoded,
    leave_for_dead_worker,
)
from streams.keys import StreamKeys
from streams.messages import EndOfStream, message_kind, session_progress

A, B = DecodeLease("a", 5000), DecodeLease("b", 5000)


def frame(session: str, seq: int) -> tuple[dict, dict]:
    return {"kind": "frame", "session": session, "seq": seq}, {
        "session": session,
        "frames": seq + 1,
        "redis_down": 0,
    }


def entries(client, keys: StreamKeys, camera: str) -> list[tuple[str, str]]:
    """(kind, session) of each entry of the camera's stream."""
    return [
        (message_kind(fields) or "frame", fields[b"session"].decode())
        for _id, fields in client.xrange(keys.frames(camera))
    ]


@pytest.fixture
def keys(prefix) -> StreamKeys:
    return StreamKeys(prefix)


def claimed(client, keys: StreamKeys, camera: str, lease: DecodeLease, session: str, final=False):
    """A decoder's fence for ``session``, claimed under ``lease`` as the supervisor does."""
    assert claim_session(client, keys, camera, lease, session, final=final)
    return SessionFence(client, keys, camera, lease, final=final)


def test_a_decoder_taken_over_writes_nothing_more_even_once_its_lease_is_back(redis_client, keys):
    redis_client.set(keys.decode_lease("cam"), "a")
    old = claimed(redis_client, keys, "cam", A, "s1")
    for seq in range(3):
        old.frame(redis_client, *frame("s1", seq), maxlen=None)
    # a is cut off past its TTL; b takes the camera and ends a's session from its progress
    redis_client.set(keys.decode_lease("cam"), "b")
    ended = end_session_in_progress(redis_client, keys, "cam", B, "a was lost", final=False)
    assert (ended.session, ended.frames, ended.reason) == ("s1", 3, "crashed")
    with pytest.raises(LeaseLost, match="another decode worker took it over"):
        old.frame(redis_client, *frame("s1", 3), maxlen=None)
    # b's worker dies too, and a's worker holds the lease again: a's old session stays ended
    redis_client.set(keys.decode_lease("cam"), "a")
    with pytest.raises(LeaseLost):
        old.frame(redis_client, *frame("s1", 3), maxlen=None)
    with pytest.raises(LeaseLost):
        old.end(redis_client, EndOfStream("cam", 4, "stopped", session="s1"))
    assert entries(redis_client, keys, "cam") == [("frame", "s1")] * 3 + [("end", "s1")]


def test_a_decoder_that_never_wrote_cannot_write_after_its_camera_went_on_without_it(
    redis_client, keys
):
    """The session is claimed before its decoder starts: a decoder stalled before its first
    write finds it ended, even once the file was decoded elsewhere and the lease let go."""
    redis_client.set(keys.decode_lease("clip"), "a")
    stalled = claimed(redis_client, keys, "clip", A, "s1", final=True)
    redis_client.set(keys.decode_lease("clip"), "b")  # a cut off; b took the file over
    ended = end_session_in_progress(redis_client, keys, "clip", B, "a was lost", final=True)
    assert ended.frames == 0 and file_decoded(redis_client, keys, "clip")
    assert not claim_session(redis_client, keys, "clip", B, "s2", final=True)  # decoded
    redis_client.delete(keys.decode_lease("clip"))  # b let it go
    with pytest.raises(LeaseLost):
        stalled.frame(redis_client, *frame("s1", 0), maxlen=None)
    with pytest.raises(LeaseLost):
        stalled.progress(redis_client, frame("s1", 0)[1])
    assert entries(redis_client, keys, "clip") == [("end", "s1")]


def test_a_decoder_cut_off_while_nobody_took_its_camera_writes_on(redis_client, keys):
    redis_client.set(keys.decode_lease("cam"), "a", px=50)
    fence = claimed(redis_client, keys, "cam", A, "s1")
    fence.frame(redis_client, *frame("s1", 0), maxlen=None)
    redis_client.delete(keys.decode_lease("cam"))  # its lease ran out; no worker took it
    fence.frame(redis_client, *frame("s1", 1), maxlen=None)
    assert redis_client.get(keys.decode_lease("cam")) == b"a"  # its own again
    # for a tick of a (a third of the TTL, at most 1 s): should a have died unseen, not a TTL
    assert 0 < redis_client.pttl(keys.decode_lease("cam")) <= A.taken_back_ms == 1000
    redis_client.delete(keys.decode_lease("cam"))
    fence.progress(redis_client, frame("s1", 1)[1])  # the script's write takes it back alike
    assert 0 < redis_client.pttl(keys.decode_lease("cam")) <= A.taken_back_ms
    # and the worker that would take it now cannot; a's next tick renews it whole
    b = CameraLeases(redis_client, keys, "b", ["cam"], ttl_s=5, role=DECODERS)
    assert b.tick().gained == ()
    a = CameraLeases(redis_client, keys, "a", ["cam"], ttl_s=5, role=DECODERS)
    a.held.add("cam")
    a.renew()
    assert redis_client.pttl(keys.decode_lease("cam")) > A.taken_back_ms


def test_a_decoder_whose_worker_died_never_takes_its_lease_back(redis_client, keys):
    """A SIGKILLed decode worker's decode process writes on for a moment: while its lease is
    in force, its frames and its end go in (counted: nothing lost); once the lease ran out,
    nothing more, the lease left free for the worker that wins the camera (taken back, it
    held the camera another whole TTL with nobody renewing it)."""
    worker = {"alive": True}
    redis_client.set(keys.decode_lease("cam"), "a", px=5000)
    assert claim_session(redis_client, keys, "cam", A, "s1", final=False)
    fence = SessionFence(
        redis_client, keys, "cam", A, final=False, worker_alive=lambda: worker["alive"]
    )
    fence.frame(redis_client, *frame("s1", 0), maxlen=None)
    worker["alive"] = False  # killed; the lease is still in force
    fence.frame(redis_client, *frame("s1", 1), maxlen=None)
    redis_client.delete(keys.decode_lease("cam"))  # it ran out
    with pytest.raises(WorkerGone, match="its decode worker is gone"):
        fence.frame(redis_client, *frame("s1", 2), maxlen=None)
    with pytest.raises(WorkerGone, match="its decode worker is gone"):
        fence.progress(redis_client, frame("s1", 2)[1])
    with pytest.raises(WorkerGone, match="its decode worker is gone"):
        fence.end(redis_client, EndOfStream("cam", 2, "stopped", session="s1"))
    assert redis_client.get(keys.decode_lease("cam")) is None
    # the worker that wins it takes it at its next tick, and ends the session from progress
    b = CameraLeases(redis_client, keys, "b", ["cam"], ttl_s=5, role=DECODERS)
    assert b.tick().gained == ("cam",)
    ended = end_session_in_progress(redis_client, keys, "cam", B, "a was lost", final=False)
    assert (ended.session, ended.frames) == ("s1", 2)
    assert entries(redis_client, keys, "cam") == [("frame", "s1")] * 2 + [("end", "s1")]


def test_a_decoder_whose_worker_died_ends_its_session_while_the_lease_is_in_force(
    redis_client, keys
):
    redis_client.set(keys.decode_lease("cam"), "a", px=5000)
    assert claim_session(redis_client, keys, "cam", A, "s1", final=False)
    fence = SessionFence(redis_client, keys, "cam", A, final=False, worker_alive=lambda: False)
    fence.frame(redis_client, *frame("s1", 0), maxlen=None)
    fence.end(redis_client, EndOfStream("cam", 1, "stopped", session="s1"))
    assert entries(redis_client, keys, "cam") == [("frame", "s1"), ("end", "s1")]


def test_a_dead_workers_last_will_frees_its_own_leases_for_the_next_tick_not_the_ttl(
    redis_client, keys
):
    """Its decode processes let go of the leases of the cameras they decoded and drop its
    heartbeat: the worker that wins them takes them at its next tick, with a TTL of minutes
    left; another worker's lease, and a camera of the dead one decoded elsewhere, are kept."""
    a = CameraLeases(redis_client, keys, "a", ["c1", "c2"], ttl_s=300, role=DECODERS)
    b = CameraLeases(redis_client, keys, "b", ["c3"], ttl_s=300, role=DECODERS)
    assert set(a.tick().gained) == {"c1", "c2"} and b.tick().gained == ("c3",)
    released = leave_for_dead_worker(redis_client, keys, "a", ["c1", "c3"])
    assert released == 1
    assert redis_client.get(keys.decode_lease("c1")) is None
    assert redis_client.get(keys.decode_lease("c2")) == b"a"  # not decoded there: its TTL
    assert redis_client.get(keys.decode_lease("c3")) == b"b"
    assert redis_client.zrange(keys.decode_workers(), 0, -1) == [b"b"]
    b.add_camera("c1")
    b.add_camera("c2")
    assert b.tick().gained == ("c1",)


def test_a_new_session_is_claimed_only_where_none_is_in_progress(redis_client, keys):
    redis_client.set(keys.decode_lease("cam"), "a")
    first = claimed(redis_client, keys, "cam", A, "s1")
    assert not claim_session(redis_client, keys, "cam", A, "s2", final=False)
    assert not claim_session(redis_client, keys, "cam", B, "s2", final=False)  # a's lease
    first.end(redis_client, EndOfStream("cam", 0, "stopped", session="s1"))
    assert claim_session(redis_client, keys, "cam", A, "s2", final=False)


def test_a_files_session_that_ends_marks_the_file_decoded(redis_client, keys):
    redis_client.set(keys.decode_lease("clip"), "a")
    fence = claimed(redis_client, keys, "clip", A, "s1", final=True)
    fence.frame(redis_client, *frame("s1", 0), maxlen=None)
    assert not file_decoded(redis_client, keys, "clip")
    fence.end(redis_client, EndOfStream("clip", 1, "eof", session="s1"))
    assert file_decoded(redis_client, keys, "clip")
    assert session_progress(redis_client.hgetall(keys.progress("clip"))) is None
    assert not claim_session(redis_client, keys, "clip", A, "s2", final=True)


def test_a_session_is_ended_once_and_only_by_the_lease_holder(redis_client, keys):
    redis_client.set(keys.decode_lease("cam"), "a")
    claimed(redis_client, keys, "cam", A, "s1").frame(redis_client, *frame("s1", 0), maxlen=None)
    assert end_session_in_progress(redis_client, keys, "cam", B, "b is late", final=False) is None
    assert session_progress(redis_client.hgetall(keys.progress("cam")))[0] == "s1"
    # b takes over: s1 ended, s2 runs; a's supervisor, finding its s1 decoder dead, ends
    # nothing more (s1 has its end; s2 is not its to end)
    redis_client.set(keys.decode_lease("cam"), "b")
    assert end_session_in_progress(redis_client, keys, "cam", B, "a lost", final=False)
    claimed(redis_client, keys, "cam", B, "s2")
    redis_client.delete(keys.decode_lease("cam"))
    mine = end_session_in_progress(
        redis_client, keys, "cam", A, "a's decoder died", final=False, session="s1"
    )
    assert mine is None
    assert [kind for kind, _ in entries(redis_client, keys, "cam")] == ["frame", "end"]


def test_a_lost_workers_sessions_are_ended_together_as_one_by_one(redis_client, keys):
    """A worker taking over a lost one's cameras ends their sessions in two round trips, as
    it would one by one: a file's marks it decoded; a camera with no session in progress, or
    whose lease is another worker's, is left alone."""
    sessions = {"c1": "s1", "c2": "s2", "clip": "s3", "theirs": "s4"}
    for camera, session in sessions.items():
        redis_client.set(keys.decode_lease(camera), "a")
        fence = claimed(redis_client, keys, camera, A, session, final=camera == "clip")
        for seq in range(2):
            fence.frame(redis_client, *frame(session, seq), maxlen=None)
    for camera in ("c1", "c2", "clip", "idle"):
        redis_client.set(keys.decode_lease(camera), "b")  # a was lost; b took these
    redis_client.set(keys.decode_lease("theirs"), "c")
    ended = end_sessions_in_progress(
        redis_client,
        keys,
        ["c1", "c2", "clip", "idle", "theirs"],
        B,
        lambda camera: f"{camera}: a was lost",
        final=lambda camera: camera == "clip",
    )
    assert sorted(ended) == ["c1", "c2", "clip"]
    for camera, end in ended.items():
        assert (end.session, end.frames, end.reason) == (sessions[camera], 2, "crashed")
        assert end.error == f"{camera}: a was lost"
        assert entries(redis_client, keys, camera) == [("frame", sessions[camera])] * 2 + [
            ("end", sessions[camera])
        ]
        assert session_progress(redis_client.hgetall(keys.progress(camera))) is None
    assert file_decoded(redis_client, keys, "clip") and not file_decoded(redis_client, keys, "c1")
    assert session_progress(redis_client.hgetall(keys.progress("theirs")))[0] == "s4"
    assert entries(redis_client, keys, "theirs") == [("frame", "s4")] * 2


def test_decode_and_detector_leases_are_apart(redis_client, keys):
    decoders = CameraLeases(redis_client, keys, "w", ["cam"], ttl_s=5, role=DECODERS)
    detectors = CameraLeases(redis_client, keys, "w", ["cam"], ttl_s=5)
    assert decoders.tick().gained == ("cam",) and detectors.tick().gained == ("cam",)
    assert redis_client.get(keys.decode_lease("cam")) == b"w"
    assert redis_client.get(keys.lease("cam")) == b"w"
    assert redis_client.zrange(keys.decode_workers(), 0, -1) == [b"w"]
    decoders.leave()
    assert redis_client.get(keys.lease("cam")) == b"w"  # the detector's kept
    assert redis_client.get(keys.decode_lease("cam")) is None


class TakenOverWhileLooking(SessionFence):
    """A fence whose camera another worker takes over just after it looked at the lease (the
    window a WATCH closes): the transaction must not run."""

    def __init__(self, *args, redis_client, keys, **kwargs):
        super().__init__(*args, **kwargs)
        self._other, self._other_keys, self.looks = redis_client, keys, 0

    def _check(self, owner, session, mine):
        super()._check(owner, session, mine)
        self.looks += 1
        if self.looks == 1:
            self._other.set(self._other_keys.decode_lease("cam"), "b")


def test_a_take_over_between_the_look_and_the_write_stops_the_write(redis_url, keys):
    client = redis.Redis.from_url(redis_url)
    other = redis.Redis.from_url(redis_url)  # another connection: WATCH sees its write
    try:
        client.set(keys.decode_lease("cam"), "a")
        assert claim_session(client, keys, "cam", A, "s1", final=False)
        fence = TakenOverWhileLooking(
            client, keys, "cam", A, final=False, redis_client=other, keys=keys
        )
        with pytest.raises(LeaseLost):
            fence.frame(client, *frame("s1", 0), maxlen=None)
        assert fence.looks == 1 and client.xlen(keys.frames("cam")) == 0
    finally:
        client.close()
        other.close()


def test_sessions_are_claimed_together_and_one_refused_by_redis_leaves_the_others_claimed(
    redis_client, keys
):
    """A worker taking over hundreds of cameras claims their sessions in one pipeline: a claim
    Redis answers with an error (here a progress key of the wrong type) is not claimed, and
    tried again at the next tick; the others are claimed."""
    redis_client.set(keys.progress("broken"), "not a hash")
    claims = [SessionClaim(camera, f"s-{camera}", False) for camera in ("c1", "broken", "c2")]
    assert claim_sessions(redis_client, keys, A, claims) == {
        "c1": True,
        "broken": False,
        "c2": True,
    }
    assert session_progress(redis_client.hgetall(keys.progress("c2")))[0] == "s-c2"
