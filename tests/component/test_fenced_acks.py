"""What a detector worker found in a camera's stream (drops, a session's end, its position) and
the acknowledgement of its frames go through, on a real redis-server, only while no other
worker holds the camera's lease: a worker whose lease ran out unnoticed once wrote as
``overflow`` frames the camera's new holder had detected."""

from __future__ import annotations

import pytest

from pipeline.ledger.acks import FrameAcks, StreamAck
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import CameraPosition, LedgerEntry


@pytest.fixture
def pending(redis_client, prefix):
    """Two frames of cameras ``gate`` and ``yard`` each, read by worker w1, not acknowledged."""
    keys = StreamKeys(prefix)
    ids = {}
    for camera in ("gate", "yard"):
        frames = keys.frames(camera)
        redis_client.xgroup_create(frames, FRAMES_GROUP, id="0", mkstream=True)
        ids[camera] = [redis_client.xadd(frames, {"seq": str(n)}) for n in range(2)]
        redis_client.xreadgroup(FRAMES_GROUP, "w1", {frames: ">"})
    return keys, ids


def overflow(camera: str, first_seq: int, count: int) -> LedgerEntry:
    return LedgerEntry(camera, "s1", "drop", first_seq, count, "overflow", 1000.0)


def acks_of(redis_client, keys: StreamKeys, worker: str | None = "w1") -> FrameAcks:
    return FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100, lease_holder=worker)


def written(redis_client, keys: StreamKeys, camera: str) -> tuple[list[LedgerEntry], int, dict]:
    """The camera's ledger, its frames pending, and its kept position."""
    ledger = [LedgerEntry.from_fields(f) for _, f in redis_client.xrange(keys.ledger(camera))]
    pending = redis_client.xpending(keys.frames(camera), FRAMES_GROUP)["pending"]
    return ledger, pending, redis_client.hgetall(keys.cursor(camera))


def test_the_lease_holder_writes_drops_position_and_acknowledgement_together(redis_client, pending):
    keys, ids = pending
    redis_client.set(keys.lease("gate"), "w1")
    gap, position = overflow("gate", 2, 3), CameraPosition("s1", 5, entry_id="9-0")
    assert acks_of(redis_client, keys).acknowledge(
        keys.frames("gate"), ids["gate"], [gap], position=position
    )
    ledger, left, cursor = written(redis_client, keys, "gate")
    assert ledger == [gap] and left == 0 and redis_client.xlen(keys.frames("gate")) == 0
    assert CameraPosition.from_fields(cursor) == position


def test_a_worker_whose_camera_another_worker_holds_writes_nothing(redis_client, pending):
    keys, ids = pending
    redis_client.set(keys.lease("gate"), "w2")  # w2 took it while w1's renewal ran late
    assert not acks_of(redis_client, keys).acknowledge(
        keys.frames("gate"), ids["gate"], [overflow("gate", 2, 3)], position=CameraPosition("s1", 5)
    )
    # w2 counts from the position it adopted, and claims the two entries
    assert written(redis_client, keys, "gate") == ([], 2, {})


def test_a_lease_that_ran_out_and_nobody_took_lets_the_write_through(redis_client, pending):
    """The next holder adopts the camera only after taking the lease, so it reads what went
    through; and a Redis restarted without its data loses nothing before the renewals."""
    keys, ids = pending
    assert acks_of(redis_client, keys).acknowledge(
        keys.frames("gate"), ids["gate"], [overflow("gate", 2, 1)]
    )
    assert written(redis_client, keys, "gate") == ([overflow("gate", 2, 1)], 0, {})
    assert redis_client.get(keys.lease("gate")) is None  # not taken by the write


def test_only_the_cameras_another_worker_holds_are_refused(redis_client, pending):
    keys, ids = pending
    redis_client.set(keys.lease("gate"), "w1")
    redis_client.set(keys.lease("yard"), "w2")
    acks = [
        StreamAck(keys.frames(camera), ids[camera][:1], [overflow(camera, 0, 1)])
        for camera in ("gate", "yard")
    ]
    assert acks_of(redis_client, keys).acknowledge_streams(acks) == {"yard"}
    assert written(redis_client, keys, "gate")[:2] == ([overflow("gate", 0, 1)], 1)
    assert written(redis_client, keys, "yard")[:2] == ([], 2)


def test_published_frames_of_a_camera_another_worker_holds_stay_pending(redis_client, pending):
    """Their detections are written already: the holder publishes them again, a repeat that
    consumers de-duplicate by frame id, rather than finding them gone and counting them
    lost with the worker."""
    keys, ids = pending
    redis_client.set(keys.lease("gate"), "w1")
    redis_client.set(keys.lease("yard"), "w2")
    by_stream = {keys.frames(camera): ids[camera] for camera in ("gate", "yard")}
    assert acks_of(redis_client, keys).acknowledge_frames(by_stream).refused == {"yard"}
    assert written(redis_client, keys, "gate")[1] == 0
    assert written(redis_client, keys, "yard")[1] == 2


def test_a_worker_without_leases_writes_whatever_the_lease_keys_say(redis_client, pending):
    keys, ids = pending
    redis_client.set(keys.lease("gate"), "w2")  # no leases in this deployment: never read
    acks = acks_of(redis_client, keys, worker=None)
    assert acks.acknowledge(keys.frames("gate"), ids["gate"], [overflow("gate", 2, 1)])
    assert not acks.acknowledge_frames({keys.frames("yard"): ids["yard"]}).refused
    assert written(redis_client, keys, "gate")[:2] == ([overflow("gate", 2, 1)], 0)
    assert written(redis_client, keys, "yard")[1] == 0
    with pytest.raises(RuntimeError, match="positions are kept by detector workers"):
        acks.acknowledge(keys.frames("gate"), [], position=CameraPosition("s1", 1))


def test_a_position_behind_the_kept_one_writes_nothing(redis_client, pending):
    """A write re-sent late by a worker that was cut off, arriving while nobody holds the
    lease, after another worker read the camera further: it would move the position back, and
    the next holder would count the frames since as dropped, though they were detected."""
    keys, ids = pending
    ahead = CameraPosition("s1", 9, entry_id="20-1")
    redis_client.hset(keys.cursor("gate"), mapping=ahead.to_fields())  # w2 read on, then left
    stale = CameraPosition("s1", 5, entry_id="20-0")
    assert not acks_of(redis_client, keys).acknowledge(
        keys.frames("gate"), ids["gate"], [overflow("gate", 2, 3)], position=stale
    )
    ledger, left, cursor = written(redis_client, keys, "gate")
    assert ledger == [] and left == 2 and CameraPosition.from_fields(cursor) == ahead


def test_a_position_written_alone_never_moves_back(redis_client, pending):
    keys, _ = pending
    acks = acks_of(redis_client, keys)

    def record(position: CameraPosition) -> CameraPosition:
        tx = acks.transactions(atomic=False)
        acks.record_position(tx, "gate", position)
        acks.execute(tx)
        return CameraPosition.from_fields(redis_client.hgetall(keys.cursor("gate")))

    ahead = CameraPosition("s1", 9, entry_id="20-1")
    assert record(ahead) == ahead
    assert record(CameraPosition("s1", 5, entry_id="3-0")) == ahead  # re-sent late
    ended = CameraPosition("s1", 9, ended=True, entry_id="20-1")  # the same entry, read on
    assert record(ended) == ended


def test_a_position_at_or_past_the_kept_one_is_written(redis_client, pending):
    keys, ids = pending
    redis_client.hset(
        keys.cursor("gate"), mapping=CameraPosition("s1", 1, entry_id="8-0").to_fields()
    )
    position = CameraPosition("s1", 5, entry_id="8-1")
    acks = acks_of(redis_client, keys)
    assert acks.acknowledge(keys.frames("gate"), ids["gate"][:1], [], position=position)
    assert acks.acknowledge(keys.frames("gate"), ids["gate"][1:], [], position=position)
    assert written(redis_client, keys, "gate")[1:] == (
        0,
        {k.encode(): str(v).encode() for k, v in position.to_fields().items()},
    )
