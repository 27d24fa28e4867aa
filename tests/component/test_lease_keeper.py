"""A detector worker's lease keeper on a real redis-server: what its reader is told follows
the leases themselves, also when a tick is cut short by an error halfway through its cameras
(a timeout on a starved host, a cluster failover)."""

from __future__ import annotations

import pytest
import redis

from pipeline.batching import CameraRules
from pipeline.leases.camera_leases import CameraLeases
from pipeline.leases.keeper import LeaseKeeper
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.stages.changes import CameraChanges
from pipeline.stages.context import WorkerContext
from streams.groups import ensure_group
from streams.keys import StreamKeys
from streams.messages import CameraPosition

CAMERAS = ["a", "b", "c"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SimulatedTimeouts:
    """The leases' calls, of which only the first ``answered`` cameras' replies come (the
    rest time out)."""

    def __init__(self, hold_leases) -> None:
        self._hold_leases = hold_leases
        self.answered: int | None = None

    def __call__(self, cameras: list[str]) -> dict:
        if self.answered is None:
            return self._hold_leases(cameras)
        answers = self._hold_leases(cameras[: self.answered])
        for camera in cameras[self.answered :]:
            answers[camera] = redis.TimeoutError("Timeout reading from socket")
        self.answered = max(0, self.answered - len(cameras))
        return answers


@pytest.fixture
def keeper_parts(redis_client, prefix):
    keys = StreamKeys(prefix)
    for camera in CAMERAS:
        ensure_group(redis_client, keys.frames(camera))
    clock = FakeClock()
    leases = CameraLeases(redis_client, keys, "w1", CAMERAS, ttl_s=3.0, clock=clock)
    hold = SimulatedTimeouts(leases._hold_leases)
    leases._hold_leases = hold
    changes = CameraChanges()
    context = WorkerContext(
        redis=redis_client,
        keys=keys,
        accounting=Accounting(CAMERAS),
        acks=FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100, lease_holder="w1"),
        consumer="w1",
    )
    keeper = LeaseKeeper(
        context, leases=leases, changes=changes, rules=lambda camera: CameraRules(), clock=clock
    )
    return keeper, clock, hold, changes, keys


def told(changes: CameraChanges) -> list[tuple[str, str]]:
    return [(change.kind, change.camera) for change in changes.take()]


def tick(keeper: LeaseKeeper, clock: FakeClock) -> None:
    clock.now += 1.0  # the next renewal is due
    keeper.tick()


def test_a_camera_lost_in_a_tick_cut_short_is_dropped_before_it_is_adopted_again(
    redis_client, keeper_parts
):
    keeper, clock, hold, changes, keys = keeper_parts
    tick(keeper, clock)
    assert told(changes) == [("adopt", camera) for camera in CAMERAS]
    redis_client.set(keys.lease("a"), "w2")  # w1 was stalled past its TTL; w2 took "a"
    hold.answered = 1  # "a" is found lost, then the renewal of "b" times out
    with pytest.raises(redis.TimeoutError):
        tick(keeper, clock)
    assert told(changes) == [("drop", "a")]
    hold.answered = None
    redis_client.delete(keys.lease("a"))  # w2 gone: "a" comes back
    tick(keeper, clock)
    # the reader reads "a" again from its own pending entries (claimed for it now), not on
    # from where it was
    assert told(changes) == [("adopt", "a")]


def test_a_camera_won_in_a_tick_cut_short_is_adopted_at_the_next(redis_client, keeper_parts):
    keeper, clock, hold, changes, keys = keeper_parts
    hold.answered = 1  # "a" is won, then the lease call for "b" times out
    with pytest.raises(redis.TimeoutError):
        tick(keeper, clock)
    # held, but adopted (its pending frames claimed) only once a renewal went through whole
    assert told(changes) == []
    hold.answered = None
    tick(keeper, clock)
    assert told(changes) == [("adopt", "a"), ("adopt", "b"), ("adopt", "c")]


def test_a_camera_is_not_adopted_once_the_leases_may_have_run_out(redis_client, keeper_parts):
    """A tick that ran late on a starved host: claiming now would take the frames of the
    worker that may hold the camera by now, behind the position it adopted, where it never
    looks for them again."""
    keeper, clock, hold, changes, keys = keeper_parts
    frames = keys.frames("a")
    redis_client.xadd(frames, {"seq": "0"})
    redis_client.xreadgroup("framebatch-batcher", "w2", {frames: ">"})  # w2 holds "a" now
    keeper._leases.valid_until = clock.now  # the renewal's trust ran out as the tick ended
    clock.now += 1.0
    keeper._leases.held.add("a")  # as the last renewal, long ago, left it
    keeper._settle()
    assert told(changes) == []
    assert redis_client.xpending(frames, "framebatch-batcher")["consumers"] == [
        {"name": b"w2", "pending": 1}
    ]


def test_a_camera_another_worker_read_on_while_the_lease_had_run_out_is_taken_over_again(
    redis_client, keeper_parts
):
    """w1 was cut off past the TTL; meanwhile w2 took "a", read it on and let it go.  Renewed
    on w1's return, "a" is adopted again from w2's position, not read on from w1's own (which
    would count w2's frames as dropped)."""
    keeper, clock, hold, changes, keys = keeper_parts
    tick(keeper, clock)
    assert told(changes) == [("adopt", camera) for camera in CAMERAS]
    w2 = CameraPosition("s1", 41, entry_id="99-0")
    redis_client.hset(keys.cursor("a"), mapping=w2.to_fields())
    for camera in CAMERAS:
        redis_client.delete(keys.lease(camera))  # run out while w1 was away
    clock.now += 5.0  # the cut: past the 3 s TTL
    tick(keeper, clock)
    taken = changes.take()
    assert [(c.kind, c.camera) for c in taken] == [("drop", "a"), ("adopt", "a")]
    assert taken[1].position == w2


def test_a_camera_nobody_read_while_the_lease_had_run_out_is_read_on(redis_client, keeper_parts):
    """Dropped and adopted again, its frames in flight in this worker's detector would be
    read a second time from its own pending entries: counted dropped as stale while their
    first reading published them."""
    keeper, clock, hold, changes, keys = keeper_parts
    tick(keeper, clock)
    told(changes)
    own = CameraPosition("s1", 7, entry_id="50-0")
    redis_client.hset(keys.cursor("a"), mapping=own.to_fields())
    keeper._acks.noted("a", own)  # as the reader's last position write did
    clock.now += 5.0
    tick(keeper, clock)
    assert told(changes) == []


def test_a_write_refused_as_behind_while_the_lease_is_held_is_taken_over_again(
    redis_client, keeper_parts
):
    """w1 holds "a", and its position write is refused: the kept one is past it (written
    while the lease was nobody's, by a path not known today).  Only logged, the camera's
    entries stayed pending on w1 until it restarted; now its next tick takes "a" over again
    from the kept position, as a camera read on elsewhere while its lease had run out."""
    keeper, clock, hold, changes, keys = keeper_parts
    tick(keeper, clock)
    told(changes)
    kept = CameraPosition("s1", 41, entry_id="99-0")
    redis_client.hset(keys.cursor("a"), mapping=kept.to_fields())
    behind = CameraPosition("s1", 3, entry_id="20-0")
    assert not keeper._acks.acknowledge(keys.frames("a"), [], position=behind)  # refused
    tick(keeper, clock)
    taken = changes.take()
    assert [(c.kind, c.camera) for c in taken] == [("drop", "a"), ("adopt", "a")]
    assert taken[1].position == kept
    tick(keeper, clock)
    assert told(changes) == []  # looked at once


def test_a_renewal_a_little_late_but_within_the_ttl_is_no_take_over(redis_client, keeper_parts):
    keeper, clock, hold, changes, keys = keeper_parts
    tick(keeper, clock)
    told(changes)
    clock.now += 1.7  # 2.7 s after the last renewal went out: late, within the 3 s TTL
    keeper.tick()
    assert told(changes) == []
