"""Zone occupancy per class, entries, exits, dwell and loitering, by track.

A track enters after ``inertia`` frames in a row with its anchor inside (supervision's
``PolygonZone`` decides inside, per frame) and exits after as many outside, or when its track
ends.  Dwell runs from the frame its entry was confirmed in to the one its exit was; times are
the stream's (pts), so a replay at any speed dwells as long as the scene did.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Visit:
    entered: float  # stream seconds
    class_id: int  # the track's class when it entered: its exit and occupancy count there
    loitered: bool = False


@dataclass
class ZoneState:
    """What one zone remembers between frames."""

    inside: dict[int, Visit] = field(default_factory=dict)
    runs: dict[int, int] = field(default_factory=dict)  # frames in a row against `inside`
    entries: Counter[int] = field(default_factory=Counter)  # by class
    exits: Counter[int] = field(default_factory=Counter)

    def occupancy(self) -> Counter[int]:
        return Counter(visit.class_id for visit in self.inside.values())


ZoneChange = tuple[str, int, int, float | None]  # (kind, index or -1, track id, dwell_s)


class ZoneCounter:
    def __init__(self, inertia: int, loiter_s: float | None, state: ZoneState | None = None):
        self._inertia = inertia
        self._loiter_s = loiter_s
        self.state = state or ZoneState()

    def update(
        self, track_ids: np.ndarray, class_ids: np.ndarray, inside: np.ndarray, now: float
    ) -> list[ZoneChange]:
        """One frame's confirmed tracks (ids, classes, anchor inside or not) at stream time
        ``now``: entries, exits and loiterings, with the index of the track's detection."""
        state = self.state
        changes: list[ZoneChange] = []
        for index, (track, class_id, is_in) in enumerate(
            zip((int(t) for t in track_ids), (int(c) for c in class_ids), inside, strict=True)
        ):
            visit = state.inside.get(track)
            if bool(is_in) == (visit is not None):
                state.runs.pop(track, None)
            else:
                run = state.runs.get(track, 0) + 1
                if run < self._inertia:
                    state.runs[track] = run
                else:
                    state.runs.pop(track, None)
                    if visit is None:
                        visit = state.inside[track] = Visit(now, class_id)
                        state.entries[class_id] += 1
                        changes.append(("zone_enter", index, track, None))
                    else:
                        changes.append(("zone_exit", index, track, self._leave(track, now)))
                        continue
            if visit is None:
                continue
            dwell = now - visit.entered
            if self._loiter_s is not None and not visit.loitered and dwell > self._loiter_s:
                visit.loitered = True
                changes.append(("loiter", index, track, dwell))
        return changes

    def end_track(self, track: int, now: float) -> ZoneChange | None:
        """A track that ended leaves the zone it was in."""
        self.state.runs.pop(track, None)
        if track not in self.state.inside:
            return None
        return ("zone_exit", -1, track, self._leave(track, now))

    def _leave(self, track: int, now: float) -> float:
        visit = self.state.inside.pop(track)
        self.state.exits[visit.class_id] += 1
        return now - visit.entered
