"""Camera leases on a real redis-server: one owner per camera, a dead worker's cameras move
within the TTL and a tick, a joining worker gets its share handed over, a leaving one frees
its cameras at once."""

from __future__ import annotations

import time
from functools import partial

from pipeline.leases.camera_leases import (
    RUN_OUT_MARGIN_S,
    CameraLeases,
    rendezvous_owner,
    worker_alive,
)
from streams.keys import StreamKeys
from streams.redis_cluster import server_time_ms

CAMERAS = [f"cam{i}" for i in range(24)]
TTL_S = 1.0


def workers(redis_client, prefix, *names):
    return [
        CameraLeases(redis_client, StreamKeys(prefix), name, CAMERAS, ttl_s=TTL_S) for name in names
    ]


def settle(leases: list[CameraLeases], rounds: int = 3) -> None:
    """A few ticks of each, handing over what each is asked to (nothing to finish here)."""
    for _ in range(rounds):
        for worker in leases:
            for camera in worker.tick().handing_over:
                worker.release(camera)


def owners_in_redis(redis_client, prefix) -> dict[str, str]:
    keys = StreamKeys(prefix)
    return {c: (redis_client.get(keys.lease(c)) or b"").decode() for c in CAMERAS}


def test_each_camera_has_one_owner_the_one_rendezvous_hashing_picks(redis_client, prefix):
    leases = workers(redis_client, prefix, "a", "b", "c")
    settle(leases)
    held = [c for worker in leases for c in worker.held]
    assert sorted(held) == sorted(CAMERAS)  # each exactly once
    expected = {c: rendezvous_owner(c, ["a", "b", "c"]) for c in CAMERAS}
    assert owners_in_redis(redis_client, prefix) == expected
    for worker in leases:
        assert worker.held == {c for c, w in expected.items() if w == worker.worker_id}


def test_a_dead_workers_cameras_move_within_the_ttl_and_a_tick(redis_client, prefix):
    a, b = workers(redis_client, prefix, "a", "b")
    settle([a, b])
    orphans = set(a.held)
    assert orphans and b.held.isdisjoint(orphans)
    died = time.monotonic()  # a stops ticking: killed
    taken: set[str] = set()
    while taken != orphans and time.monotonic() - died < 5:
        taken |= set(b.tick().gained)
        time.sleep(b.tick_s)
    moved_after = time.monotonic() - died
    assert taken == orphans
    assert TTL_S * 0.8 < moved_after <= TTL_S + b.tick_s + 0.5  # not before the lease ran out
    assert b.held == set(CAMERAS)
    # the dead worker, back (a link that came up again), has lost them and stops at once
    changes = a.tick()
    assert set(changes.lost) == orphans and not a.held


def test_a_workers_heartbeat_runs_out_after_the_leases_it_renewed(redis_client, prefix):
    """So a worker that sees it ran out finds them free: taken at that tick, not the next."""

    def slow_plan(live):  # a tick's plan takes a while between the heartbeat and the leases
        time.sleep(0.05)
        return partial(rendezvous_owner, workers=live)

    keys = StreamKeys(prefix)
    a = CameraLeases(redis_client, keys, "a", CAMERAS, ttl_s=TTL_S, owner_of=slow_plan)
    a.tick()
    assert a.held == set(CAMERAS)
    runs_out = redis_client.zscore(keys.workers(), "a")
    leases_run_out = [redis_client.execute_command("PEXPIRETIME", keys.lease(c)) for c in CAMERAS]
    assert runs_out >= max(leases_run_out)


def test_the_next_tick_comes_when_another_workers_heartbeat_runs_out(redis_client, prefix):
    clock = FakeClock()
    keys = StreamKeys(prefix)
    a = CameraLeases(redis_client, keys, "a", CAMERAS, ttl_s=3.0)
    b = CameraLeases(redis_client, keys, "b", CAMERAS, ttl_s=3.0, clock=clock)
    a.tick()
    b.tick()
    assert b.next_tick_in() == b.tick_s  # a runs out in about 3 s: a tick of b comes first
    # a's heartbeat runs out in 0.6 s (it died a while ago)
    redis_client.zadd(keys.workers(), {"a": server_time_ms(redis_client) + 600})
    clock.now += b.tick_s
    b.tick()
    assert b.next_tick_in() <= 0.6 + RUN_OUT_MARGIN_S  # not a whole tick_s (1 s)


def test_the_tick_at_a_dead_workers_run_out_takes_its_cameras(redis_client, prefix):
    """The heartbeat runs out after the leases renewed with it: the tick that finds a worker
    dead finds its cameras free, even when its tick took a while between the two."""

    def slow_plan(live):
        time.sleep(0.3)
        return partial(rendezvous_owner, workers=live)

    keys = StreamKeys(prefix)
    a = CameraLeases(redis_client, keys, "a", CAMERAS, ttl_s=TTL_S, owner_of=slow_plan)
    (b,) = workers(redis_client, prefix, "b")
    settle([a, b])
    orphans = set(a.held)
    a.tick()  # its last tick: it dies
    deadline = time.monotonic() + 10
    while "a" in (changes := b.tick()).workers:
        assert time.monotonic() < deadline, "a never ran out"
        time.sleep(0.02)
    assert set(changes.gained) == orphans


def test_a_joining_worker_gets_its_share_only_once_the_owner_hands_over(redis_client, prefix):
    (a,) = workers(redis_client, prefix, "a")
    settle([a])
    assert a.held == set(CAMERAS)
    (b,) = workers(redis_client, prefix, "b")
    share = {c for c in CAMERAS if rendezvous_owner(c, ["a", "b"]) == "b"}
    assert share and not b.tick().gained  # registered; the cameras are still a's
    changes = a.tick()
    assert set(changes.handing_over) == share and a.handing_over == share
    assert not b.tick().gained  # a is still finishing their frames: the leases hold
    for camera in share:
        a.release(camera)
    assert set(b.tick().gained) == share
    assert a.held == set(CAMERAS) - share and not a.handing_over


def test_letting_go_of_many_leases_at_once_frees_only_this_workers(redis_client, prefix):
    """``release_all``: one pipeline for every camera handed over; a lease another worker
    holds by then (this one's ran out, and it was taken) is left alone."""
    a, b = workers(redis_client, prefix, "a", "b")
    settle([a, b])
    mine = sorted(a.held)
    taken = mine[0]
    redis_client.set(StreamKeys(prefix).lease(taken), "b")  # a's ran out, and b took it
    a.release_all(mine)
    owners = owners_in_redis(redis_client, prefix)
    assert owners[taken] == "b"
    assert all(owners[c] == "" for c in mine[1:])
    assert not a.held and not a.handing_over
    assert set(a.tick().gained) == set(mine[1:])  # free: taken again by their owner


def test_workers_that_join_before_they_take_never_hand_over(redis_client, prefix):
    """Workers started together (a decode fleet): taking at the first tick, the first one
    takes every camera and hands most over again; joining first, each takes its share."""
    eager = workers(redis_client, prefix, "a", "b", "c")
    first = [worker.tick() for worker in eager]
    assert set(first[0].gained) == set(CAMERAS)  # a was alone at its first tick
    assert eager[0].tick().handing_over  # and gives b's and c's away again
    for worker in eager:
        worker.leave()
    joining = workers(redis_client, prefix + "-joining", "a", "b", "c")
    assert not any(worker.any_held() for worker in joining)  # a fleet starting: join first
    for worker in joining:
        worker.join()
    changes = [worker.tick() for worker in joining]
    assert all(not c.handing_over for c in changes)
    for worker, change in zip(joining, changes, strict=True):
        expected = {c for c in CAMERAS if rendezvous_owner(c, ["a", "b", "c"]) == worker.worker_id}
        assert set(change.gained) == expected == worker.held
    assert all(worker.any_held() for worker in joining)  # one joining now takes at once


def test_after_redis_forgot_the_workers_none_takes_another_ones_cameras(redis_client, prefix):
    """Redis restarted without its data: the first worker to tick saw itself alone and took
    every camera whose holder had not renewed yet, which the holders then lost, each a new
    session (decoders) or a take-over (detectors).  A worker whose heartbeat is gone although
    it renewed it within the TTL only renews what it holds that tick; nothing moves."""
    fleet = workers(redis_client, prefix, "a", "b", "c")
    settle(fleet)
    before = {worker.worker_id: set(worker.held) for worker in fleet}
    redis_client.delete(*redis_client.keys(f"{prefix}:*"))  # restarted empty
    changes = [worker.tick() for worker in fleet]  # each sees the ones that ticked before it
    assert [(c.gained, c.lost, c.handing_over) for c in changes] == [((), (), ())] * 3
    assert {w.worker_id: w.held for w in fleet} == before
    settle(fleet, rounds=2)  # all registered again: each plans with all of them
    assert {w.worker_id: w.held for w in fleet} == before
    assert owners_in_redis(redis_client, prefix) == {
        c: w for w, cameras in before.items() for c in cameras
    }


def test_after_an_outage_past_the_ttl_redis_back_empty_nothing_moves(redis_client, prefix):
    """A decode worker's calls fail fast through an outage: after one longer than the TTL its
    last heartbeat is old, and Redis may come back without anybody's (a failover, a restart
    without data).  Judged by the time since it, the first to tick took 18 of 24 cameras."""
    now = [1000.0]
    fleet = [
        CameraLeases(
            redis_client, StreamKeys(prefix), name, CAMERAS, ttl_s=TTL_S, clock=lambda: now[0]
        )
        for name in ("a", "b", "c")
    ]
    settle(fleet)
    before = {worker.worker_id: set(worker.held) for worker in fleet}
    now[0] += 30 * TTL_S  # the outage: no heartbeat went through
    redis_client.delete(*redis_client.keys(f"{prefix}:*"))  # back empty
    changes = [worker.tick() for worker in fleet]
    assert [c.gained for c in changes] == [()] * 3
    settle(fleet, rounds=2)
    assert {w.worker_id: w.held for w in fleet} == before


def test_a_leaving_worker_frees_its_cameras_at_once(redis_client, prefix):
    a, b = workers(redis_client, prefix, "a", "b")
    settle([a, b])
    theirs = set(a.held)
    a.leave()
    assert set(b.tick().gained) == theirs  # no TTL to wait out
    assert redis_client.zrange(StreamKeys(prefix).workers(), 0, -1) == [b"b"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_reads_only_while_its_last_renewal_is_surely_in_force(redis_client, prefix):
    clock = FakeClock()
    worker = CameraLeases(redis_client, StreamKeys(prefix), "a", CAMERAS, ttl_s=TTL_S, clock=clock)
    assert not worker.valid()  # nothing renewed yet
    worker.tick()
    assert worker.valid()
    clock.now += TTL_S * 0.75
    assert worker.valid()
    clock.now += TTL_S * 0.1  # past 80 % of the TTL since the renewal was sent: overdue
    assert not worker.valid()
    worker.tick()
    assert worker.valid()


def test_a_worker_id_is_known_to_be_in_use_while_its_heartbeat_is_in_force(redis_client, prefix):
    keys = StreamKeys(prefix)
    (a,) = workers(redis_client, prefix, "a")
    assert not worker_alive(redis_client, keys, "a")
    a.tick()
    assert worker_alive(redis_client, keys, "a") and not worker_alive(redis_client, keys, "b")
    a.leave()
    assert not worker_alive(redis_client, keys, "a")
