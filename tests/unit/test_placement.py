"""Rendezvous hashing with bounded load: cameras spread by weight within the workers'
capacities, what fits nowhere is unplaced, and with no capacity it is plain rendezvous."""

from __future__ import annotations

import random

import pytest

from pipeline.leases.camera_leases import rendezvous_owner
from pipeline.leases.placement import place

CAMERAS = [f"cam{i:03d}" for i in range(200)]


def test_without_capacities_it_is_rendezvous_hashing():
    workers = {"a": None, "b": None, "c": None}
    plan = place(dict.fromkeys(CAMERAS, 1.0), workers)
    assert plan.unplaced == ()
    assert dict(plan.owners) == {c: rendezvous_owner(c, workers) for c in CAMERAS}


def test_no_worker_carries_more_than_its_capacity_and_unequal_cameras_spread_by_weight():
    rng = random.Random(7)
    # a few heavy main streams among many light sub-streams
    weights = {c: (0.5 if i % 10 == 0 else 0.05) for i, c in enumerate(CAMERAS)}
    capacities = {"a": 2.0, "b": 2.0, "c": 1.0, "d": 0.5}
    plan = place(weights, capacities)
    for worker, load in plan.load.items():
        assert load <= capacities[worker] + 1e-9, (worker, load)
    placed = sum(weights[c] for c in plan.owners)
    assert placed + sum(weights[c] for c in plan.unplaced) == pytest.approx(sum(weights.values()))
    # 19 units asked of 5.5: the heaviest go first, what is left is unplaced, never dropped
    assert set(plan.owners) | set(plan.unplaced) == set(CAMERAS)
    assert not set(plan.owners) & set(plan.unplaced)
    assert placed > 5.5 - 0.5  # packed: less than the heaviest camera's weight left unused
    shuffled = dict(rng.sample(sorted(weights.items()), len(weights)))
    assert place(shuffled, capacities) == plan  # the same plan whatever the order read


def test_a_worker_joining_moves_only_what_it_takes():
    weights = {c: 1.0 for c in CAMERAS}
    before = place(weights, {"a": 80.0, "b": 80.0, "c": 80.0})
    after = place(weights, {"a": 80.0, "b": 80.0, "c": 80.0, "d": 80.0})
    moved = [c for c in CAMERAS if before.owner(c) != after.owner(c)]
    assert all(after.owner(c) == "d" for c in moved)
    assert 30 <= len(moved) <= 70  # about a quarter


def test_a_camera_too_heavy_for_any_worker_is_unplaced_and_the_rest_still_placed():
    plan = place({"huge": 3.0, "small": 0.1}, {"a": 1.0, "b": 1.0})
    assert plan.unplaced == ("huge",) and plan.owner("small") in {"a", "b"}
    assert place({"x": 1.0}, {}).unplaced == ("x",)  # no worker at all
