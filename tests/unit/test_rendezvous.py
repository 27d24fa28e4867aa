"""Rendezvous hashing of cameras to detector workers: a join or a leave moves few cameras."""

from __future__ import annotations

from collections import Counter

from pipeline.leases.camera_leases import rendezvous_owner

CAMERAS = [f"cam{i}" for i in range(2000)]


def owners(workers: list[str]) -> dict[str, str | None]:
    return {camera: rendezvous_owner(camera, workers) for camera in CAMERAS}


def test_a_joining_worker_takes_only_its_share_and_only_from_the_others():
    before = owners(["w0", "w1", "w2", "w3"])
    after = owners(["w0", "w1", "w2", "w3", "w4"])
    moved = [c for c in CAMERAS if before[c] != after[c]]
    assert all(after[c] == "w4" for c in moved)  # nothing moves between the old workers
    assert 0.15 < len(moved) / len(CAMERAS) < 0.25  # about 1/5


def test_a_leaving_worker_frees_only_its_own_cameras_spread_over_the_rest():
    before = owners(["w0", "w1", "w2", "w3"])
    after = owners(["w0", "w1", "w3"])
    moved = [c for c in CAMERAS if before[c] != after[c]]
    assert set(moved) == {c for c in CAMERAS if before[c] == "w2"}
    shares = Counter(after[c] for c in moved)
    assert set(shares) == {"w0", "w1", "w3"} and min(shares.values()) > len(moved) / 5


def test_the_choice_does_not_depend_on_the_order_workers_are_listed_in():
    assert owners(["a", "b", "c"]) == owners(["c", "a", "b"])
    assert rendezvous_owner("cam0", []) is None
