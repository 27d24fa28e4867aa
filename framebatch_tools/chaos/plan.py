"""What a seeded fault-injection run injects, and in which order (``framebatch chaos``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: the faults of ``framebatch chaos --topology split`` (``framebatch_tools.chaos.split``), here
#: so that naming them imports nothing of the fleet's (its clip generator is not installed)
SPLIT_FAULTS = ("decode_kill", "detect_kill", "host_cut", "redis_restart", "registry_change")


@dataclass(frozen=True)
class FaultPlan:
    """``faults`` faults of ``kinds``, ``interval_s`` apart (drawn between the two), all drawn
    from ``seed``: the same plan injects the same faults in the same order."""

    faults: int
    seed: int
    interval_s: tuple[float, float]
    kinds: tuple[str, ...]

    def rng(self) -> random.Random:
        return random.Random(self.seed)

    def schedule(self, rng: random.Random) -> list[str]:
        """Rounds of every kind in a shuffled order, so that each kind comes up early."""
        kinds: list[str] = []
        while len(kinds) < self.faults:
            round_ = list(self.kinds)
            rng.shuffle(round_)
            kinds += round_
        return kinds[: self.faults]
