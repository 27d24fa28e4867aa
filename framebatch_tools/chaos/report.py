"""The report of ``framebatch chaos``: each fault, its recovery, and the audit of every camera."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class FaultResult:
    index: int
    kind: str
    at_s: float  # since the harness started
    recovered_s: float | None  # until every camera's frames flowed again (None: they did not)
    leftovers: list[str] = field(default_factory=list)  # what a dead daemon left behind


@dataclass
class ChaosReport:
    seed: int
    faults: list[FaultResult]
    cameras: list[dict[str, Any]]
    daemon_exit_codes: list[int]
    duration_s: float

    @property
    def unaccounted(self) -> int:
        return sum(len(c["unaccounted"]) for c in self.cameras)

    @property
    def survived(self) -> int:
        return sum(1 for f in self.faults if f.recovered_s is not None and not f.leftovers)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(unaccounted=self.unaccounted, survived=self.survived)
        return data

    def format(self) -> str:
        recoveries = [f.recovered_s for f in self.faults if f.recovered_s is not None]
        by_kind: dict[str, list[FaultResult]] = {}
        for fault in self.faults:
            by_kind.setdefault(fault.kind, []).append(fault)
        lines = [
            f"framebatch chaos: seed {self.seed}, {len(self.faults)} faults in "
            f"{self.duration_s:.0f} s; survived {self.survived}; frames unaccounted "
            f"{self.unaccounted}",
        ]
        if recoveries:
            lines.append(
                f"  recovery: median {statistics.median(recoveries):.1f} s, "
                f"max {max(recoveries):.1f} s"
            )
        for kind, faults in sorted(by_kind.items()):
            times = [f.recovered_s for f in faults if f.recovered_s is not None]
            median = f"{statistics.median(times):.1f} s" if times else "-"
            left = sum(len(f.leftovers) for f in faults)
            lines.append(
                f"  {kind}: {len(faults)}, recovered {len(times)} (median {median}), "
                f"leftovers {left}"
            )
        for camera in self.cameras:
            dropped = ", ".join(f"{c} {n}" for c, n in sorted(camera["dropped"].items()))
            lines.append(
                f"  camera {camera['camera']}: {camera['sessions']} sessions, "
                f"{camera['frames']} frames = {camera['detected']} detected + dropped "
                f"({dropped or 'none'}); unaccounted {len(camera['unaccounted'])}; "
                f"detection messages {camera['detected'] + camera['duplicates']} "
                f"({camera['duplicates']} duplicates removed by frame_id)"
            )
        lines.append(f"  daemon exit codes: {self.daemon_exit_codes}")
        return "\n".join(lines)
