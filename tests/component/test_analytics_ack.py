"""A camera's events, analytics state and frame acknowledgement go through together, in one
fenced script on a real redis-server, or not at all for a worker that lost the camera's lease."""

from __future__ import annotations

from pipeline.analytics.state import CameraState
from pipeline.analytics.store import AnalyticsStore, dump_state, load_state
from pipeline.ledger.acks import AnalyticsWrite, FrameAcks, FramesAcknowledged, kept_state
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.object_events import ObjectEvent


def event(seq: int, index: int, **extra) -> ObjectEvent:
    return ObjectEvent(
        kind="line_cross",
        camera="gate",
        session="s1",
        seq=seq,
        index=index,
        pts=seq / 10,
        time=1000.0 + seq,
        track_id=7,
        class_id=2,
        label="car",
        score=0.9,
        box=(1.0, 2.0, 3.0, 4.0),
        region="door",
        direction="in",
        count=index + 1,
        **extra,
    )


def write(events: list[ObjectEvent], state: bytes = b"state after") -> AnalyticsWrite:
    return AnalyticsWrite([e.to_fields() for e in events], state)


def kept(redis_client, keys: StreamKeys) -> bytes | None:
    value = redis_client.get(keys.analytics_state("gate"))
    return None if value is None else kept_state(value)


def test_the_lease_holder_writes_events_state_and_acknowledgement(redis_client, gate_pending):
    keys, frames, ids = gate_pending
    redis_client.set(keys.lease("gate"), "w1")
    acks = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100, lease_holder="w1")
    events = [event(1, 0), event(1, 1, dwell_s=None)]
    acked = acks.acknowledge_frames({frames: ids}, {"gate": write(events)})
    assert acked.refused == set() and acked.superseded == set()
    written = [
        ObjectEvent.from_fields(f) for _, f in redis_client.xrange(keys.object_events("gate"))
    ]
    assert written == events
    assert redis_client.get(keys.analytics_state("gate")) == b"state after\nafter %s" % ids[-1]
    assert redis_client.xpending(frames, FRAMES_GROUP)["pending"] == 0
    assert redis_client.xlen(frames) == 0


def test_a_worker_that_lost_the_lease_writes_nothing(redis_client, gate_pending):
    keys, frames, ids = gate_pending
    redis_client.set(keys.lease("gate"), "w2")  # moved on while w1 analysed
    acks = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100, lease_holder="w1")
    acked = acks.acknowledge_frames({frames: ids}, {"gate": write([event(1, 0)])})
    assert acked.refused == {"gate"}
    assert redis_client.xlen(keys.object_events("gate")) == 0
    assert redis_client.get(keys.analytics_state("gate")) is None
    assert redis_client.xpending(frames, FRAMES_GROUP)["pending"] == 2  # for w2 to claim


def test_a_frame_without_events_still_writes_its_state(redis_client, gate_pending):
    keys, frames, ids = gate_pending
    acks = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100)  # no leases
    assert acks.acknowledge_frames({frames: ids}, {"gate": write([])}).refused == set()
    assert kept(redis_client, keys) == b"state after"
    assert redis_client.xlen(keys.object_events("gate")) == 0
    assert redis_client.xpending(frames, FRAMES_GROUP)["pending"] == 0


def seqs_of_events(redis_client, keys: StreamKeys) -> list[int]:
    return [
        ObjectEvent.from_fields(f).seq for _, f in redis_client.xrange(keys.object_events("gate"))
    ]


def test_a_state_of_older_frames_than_the_kept_one_is_not_written(redis_client, gate_pending):
    """w1, cut off after analysing the first frame, has its write re-sent late, while nobody
    holds the lease, after w2 analysed both frames: the tracks and counts stay w2's; w1's
    events are written (w2's for the same frame were the same: a repeat, by event id)."""
    keys, frames, ids = gate_pending
    w2 = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100, lease_holder="w2")
    assert w2.acknowledge_frames({frames: ids}, {"gate": write([event(2, 0)], b"w2's")}) == (
        FramesAcknowledged()
    )
    w1 = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100, lease_holder="w1")
    late = w1.acknowledge_frames({frames: ids[:1]}, {"gate": write([event(1, 0)], b"w1's")})
    assert late == FramesAcknowledged(superseded={"gate"})
    assert kept(redis_client, keys) == b"w2's"
    assert seqs_of_events(redis_client, keys) == [2, 1]
    # the same frames again (a retry after a lost reply) are not older: they go through
    assert not w2.acknowledge_frames({frames: ids}, {"gate": write([], b"w2's again")}).superseded
    assert kept(redis_client, keys) == b"w2's again"


def test_frames_published_out_of_their_order_are_acknowledged_not_left_pending(
    redis_client, gate_pending
):
    """A batch of another image size published first (a camera whose picture changed size
    with its session): the older frame's events are written and it is acknowledged, the state
    of the newer one is kept."""
    keys, frames, ids = gate_pending
    acks = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100)  # no leases
    assert acks.acknowledge_frames({frames: ids[1:]}, {"gate": write([event(2, 0)], b"2")}) == (
        FramesAcknowledged()
    )
    acked = acks.acknowledge_frames({frames: ids[:1]}, {"gate": write([event(1, 0)], b"1")})
    assert acked == FramesAcknowledged(superseded={"gate"})
    assert kept(redis_client, keys) == b"2"
    assert seqs_of_events(redis_client, keys) == [2, 1]
    assert redis_client.xpending(frames, FRAMES_GROUP)["pending"] == 0
    assert redis_client.xlen(frames) == 0


def test_a_state_kept_before_the_newest_frame_was_written_with_it_is_read_as_it_is(
    redis_client, gate_pending
):
    keys, frames, ids = gate_pending
    redis_client.set(keys.analytics_state("gate"), b"older state")
    acks = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100)
    assert kept(redis_client, keys) == b"older state"
    assert acks.acknowledge_frames({frames: ids}, {"gate": write([])}) == FramesAcknowledged()
    assert kept(redis_client, keys) == b"state after"


def test_the_state_written_reads_back_here_and_in_an_earlier_version(redis_client, gate_pending):
    """An earlier version (a rolling upgrade, a rollback) reads the value whole: the newest
    frame's id after the compressed state is ignored there."""
    keys, frames, ids = gate_pending
    state = CameraState(session="s1", last_seq=1, last_time=0.1)
    acks = FrameAcks(redis_client=redis_client, keys=keys, ledger_maxlen=100)
    assert acks.acknowledge_frames({frames: ids}, {"gate": write([], dump_state(state))}) == (
        FramesAcknowledged()
    )
    assert AnalyticsStore(redis_client, keys).load("gate") == state
    assert load_state(redis_client.get(keys.analytics_state("gate"))) == state
