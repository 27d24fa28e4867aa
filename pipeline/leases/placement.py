"""Where each camera goes when workers have a capacity: rendezvous hashing with bounded load.

Each camera has a weight (what decoding it costs, in the unit the capacities use: cores, say)
and each worker a capacity (None: no limit).  Cameras are taken heaviest first (the id breaks
ties), and each goes to the worker that ranks highest for it by rendezvous hashing among those
with room left for it; a camera no worker has room for is unplaced.  Every worker computes the
same plan from the same cameras, weights and workers, so each takes its own share without asking
the others; with no capacity anywhere it is plain rendezvous hashing (only the cameras a worker
joining or leaving wins or frees move).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.leases.camera_leases import rendezvous_rank


@dataclass(frozen=True)
class Placement:
    owners: Mapping[str, str]  # camera -> worker
    unplaced: tuple[str, ...]  # no worker has room for these, heaviest first
    load: Mapping[str, float]  # worker -> the weight placed on it

    def owner(self, camera: str) -> str | None:
        return self.owners.get(camera)


def place(weights: Mapping[str, float], capacities: Mapping[str, float | None]) -> Placement:
    """``weights``: camera -> weight; ``capacities``: worker -> capacity (None: unlimited)."""
    owners: dict[str, str] = {}
    unplaced: list[str] = []
    load = dict.fromkeys(capacities, 0.0)
    for camera in sorted(weights, key=lambda c: (-weights[c], c)):
        weight = weights[camera]
        for worker in rendezvous_rank(camera, capacities):
            capacity = capacities[worker]
            if capacity is None or load[worker] + weight <= capacity + 1e-9:
                owners[camera] = worker
                load[worker] += weight
                break
        else:
            unplaced.append(camera)
    return Placement(owners, tuple(unplaced), load)
