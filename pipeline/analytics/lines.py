"""Counting tracks across a directed line, with supervision's ``LineZone`` rules (the tests
hold the two to the same counts) and a state that can be written to Redis and read back.

A track's side is confirmed by ``min_crossing_frames`` frames in a row on it (hysteresis): a box
jittering on the line, or one frame on the far side, counts nothing.  A crossing counts once,
when the new side is confirmed.  Only anchors between the line's ends (in the band the
perpendiculars through its ends bound) have a side.  A track unseen for as many frames as its
history holds is forgotten, so one that comes back starts from the side it is seen on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

Direction = str  # "in": to the left of start → end as drawn on the frame; "out": back


@dataclass
class LineState:
    """What one line remembers between frames."""

    #: the sides each track was seen on, newest last, as many as the line looks back (a tuple:
    #: written with every frame, it pickles at a fraction of a deque's cost)
    history: dict[int, tuple[bool, ...]] = field(default_factory=dict)
    confirmed: dict[int, bool] = field(default_factory=dict)  # side each track is counted on
    absent: dict[int, int] = field(default_factory=dict)  # frames each track has been unseen
    counts: Counter[tuple[Direction, int]] = field(default_factory=Counter)  # (dir, class)


class LineCounter:
    def __init__(
        self,
        start: tuple[float, float],
        end: tuple[float, float],
        min_crossing_frames: int,
        state: LineState | None = None,
    ):
        self._start = np.array(start, dtype=float)
        self._vector = np.array(end, dtype=float) - self._start
        length = float(np.hypot(*self._vector))
        if length == 0:
            raise ValueError("a line of zero length")
        unit = self._vector / length
        self._normal = np.array([-unit[1], unit[0]])  # perpendicular through the ends
        self._end = np.array(end, dtype=float)
        self._history_length = max(2, min_crossing_frames + 1)
        self.state = state or LineState()
        for track, history in self.state.history.items():  # min_crossing_frames changed
            if len(history) > self._history_length:
                self.state.history[track] = history[-self._history_length :]

    def update(
        self, track_ids: np.ndarray, class_ids: np.ndarray, points: np.ndarray
    ) -> list[tuple[int, Direction]]:
        """One frame's confirmed tracks (their ids, classes and anchor points): the indices
        that crossed, and which way."""
        state = self.state
        self._forget_absent({int(t) for t in track_ids})
        crossings: list[tuple[int, Direction]] = []
        if not len(track_ids):
            return crossings
        in_band = (_cross(self._normal, points - self._start) > 0) == (
            _cross(-self._normal, points - self._end) > 0
        )
        sides = _cross(self._vector, points - self._start) < 0
        for index, track in enumerate(int(t) for t in track_ids):
            if not in_band[index]:
                continue
            side = bool(sides[index])
            history = (*state.history.get(track, ()), side)[-self._history_length :]
            state.history[track] = history
            confirmed = state.confirmed.setdefault(track, side)
            if len(history) < self._history_length or side == confirmed:
                continue
            if any(seen != side for seen in history[1:]):
                continue
            state.confirmed[track] = side
            direction = "in" if side else "out"
            state.counts[(direction, int(class_ids[index]))] += 1
            crossings.append((index, direction))
        return crossings

    def _forget_absent(self, present: set[int]) -> None:
        state = self.state
        for track in list(state.history):
            if track in present:
                state.absent.pop(track, None)
                continue
            absent = state.absent.get(track, 0) + 1
            if absent >= self._history_length:
                del state.history[track]
                state.confirmed.pop(track, None)
                state.absent.pop(track, None)
            else:
                state.absent[track] = absent


def _cross(vector: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The 2-D cross product of ``vector`` with each row of ``offsets``."""
    return vector[0] * offsets[:, 1] - vector[1] * offsets[:, 0]
