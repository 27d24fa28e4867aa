"""A tracker's tracks as columns, for the state written with every acknowledgement.

Pickled one by one, a track is some thirty objects (the track, its state estimator, Kalman
filter, motion model, and twenty small arrays), and a camera with 50 tracks in view took 1.9 ms
a frame to write, more than tracking itself.  Tracks share a layout (the library's classes set
their attributes in ``__init__`` and a few caches later), so tracks of one layout are written as
one track kept whole (the template) and a column for every value below it: arrays of every track
joined into one array, other values in a tuple.  Reading back copies the template and sets each
track's values on the copy.

Not written: what the Kalman filter keeps for inspection and its scratch values (``trackers``'
``KalmanFilter``: ``state_prior``/``state_post`` and their covariances are references to its
state and covariance, and ``kalman_gain``, ``innovation`` and ``innovation_cov`` are assigned in
``update`` before they are read): the first come back as references to the state read, the
others as the template's, unread until the next update writes them.  Other arrays a track shares
with another attribute come back as equal arrays of their own, which is all the library needs,
as it assigns new arrays at each step rather than writing into them.  The unit tests carry
tracks through a written state at every frame of a scene and ask for the same output.

A track that is not a tree of the library's objects is not put in a table: :func:`pack` says so
with ``None`` and the caller pickles the tracks as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

Path = tuple[str, ...]


_KALMAN = ("trackers.utils.kalman_filter", "KalmanFilter")
_REFERENCES = {  # the Kalman filter's attribute: the one it refers to after a step
    "state_prior": "state",
    "state_post": "state",
    "state_covariance_prior": "state_covariance",
    "state_covariance_post": "state_covariance",
}
_SCRATCH = frozenset({"kalman_gain", "innovation", "innovation_cov"})


def _getter(path: Path) -> Callable[[Any], Any]:
    return attrgetter(".".join(path)) if path else (lambda obj: obj)


def _is_node(value: Any) -> bool:
    """One of the tracker library's objects, whose attributes are walked."""
    return hasattr(value, "__dict__") and type(value).__module__.startswith("trackers.")


@dataclass(frozen=True)
class _Layout:
    """The objects a track is made of (path, class, attribute names, in order), and the paths
    of the values below them in a row: the values of every object's attributes, in order."""

    nodes: tuple[tuple[Path, type, tuple[str, ...]], ...]
    leaves: tuple[tuple[int, Path], ...]  # (position in the row, path), the values written
    references: tuple[tuple[Path, str, str], ...]  # (Kalman filter, attribute, refers to)

    @staticmethod
    def of(track: Any) -> _Layout | None:
        nodes: list[tuple[Path, type, tuple[str, ...]]] = []
        leaves: list[tuple[int, Path]] = []
        references: list[tuple[Path, str, str]] = []
        seen: set[int] = set()
        queue: list[tuple[Any, Path]] = [(track, ())]
        position = 0
        while queue:  # breadth first: the order the row is read in
            node, path = queue.pop(0)
            if id(node) in seen:  # one object reached twice: not a tree
                return None
            seen.add(id(node))
            attributes = vars(node)
            nodes.append((path, type(node), tuple(attributes)))
            kalman = (type(node).__module__, type(node).__name__) == _KALMAN
            for name, value in attributes.items():
                if _is_node(value):
                    queue.append((value, (*path, name)))
                elif kalman and name in _REFERENCES and _REFERENCES[name] in attributes:
                    references.append((path, name, _REFERENCES[name]))
                elif not (kalman and name in _SCRATCH):
                    leaves.append((position, (*path, name)))
                position += 1
        return _Layout(tuple(nodes), tuple(leaves), tuple(references))

    def row(self, track: Any, getters: Sequence[Callable[[Any], Any]]) -> list | None:
        """The track's values in this layout's order, or ``None`` where it has another."""
        row: list = []
        for (_, kind, names), get in zip(self.nodes, getters, strict=True):
            try:
                node = get(track)
            except AttributeError:
                return None
            attributes = vars(node) if type(node) is kind else None
            if attributes is None or tuple(attributes) != names:
                return None
            row.extend(attributes.values())
        return row


_shape = attrgetter("shape")


def _joined(column: Sequence[Any]) -> np.ndarray | None:
    """The arrays of a column joined into one, or ``None`` where they are not all arrays of
    one shape and dtype."""
    first = column[0]
    if type(first) is not np.ndarray or first.dtype.hasobject or first.ndim == 0:
        return None
    if set(map(type, column)) != {np.ndarray} or len(set(map(_shape, column))) != 1:
        return None
    try:  # one shape: joined along the first axis, then one row per track
        joined = np.concatenate(column, dtype=first.dtype, casting="no")
    except TypeError:  # another dtype in some track
        return None
    return joined.reshape(len(column), *first.shape)


def _column(values: Sequence[Any]) -> np.ndarray | tuple | None:
    """What is written of a leaf: ``None`` where every track has the template's array (the
    filter's model matrices), else the arrays joined, else the values."""
    joined = _joined(values)
    if joined is None:
        return tuple(values)
    if (joined == joined[0]).all():
        return None
    return joined


@dataclass(frozen=True)
class _Group:
    """The tracks of one layout, at their places in the tracker's list."""

    template: Any
    layout: _Layout
    places: tuple[int, ...]
    columns: tuple[np.ndarray | tuple | None, ...]  # one per leaf: see _column

    def tracks(self) -> list:
        tracks = []
        setters = [(_getter(path[:-1]), path[-1]) for _, path in self.layout.leaves]
        for i in range(len(self.places)):
            track = copy.deepcopy(self.template)
            for (owner, name), column in zip(setters, self.columns, strict=True):
                if column is None:  # the template's, copied
                    continue
                value = column[i]
                value = value.copy() if isinstance(column, np.ndarray) else copy.deepcopy(value)
                setattr(owner(track), name, value)
            for path, name, refers_to in self.layout.references:
                kalman = _getter(path)(track)
                setattr(kalman, name, getattr(kalman, refers_to))
            tracks.append(track)
        return tracks


@dataclass(frozen=True)
class TrackTable:
    groups: tuple[_Group, ...]
    count: int

    def unpack(self) -> list:
        tracks: list = [None] * self.count
        for group in self.groups:
            for place, track in zip(group.places, group.tracks(), strict=True):
                tracks[place] = track
        return tracks


@dataclass
class _Rows:
    """The tracks of one layout met so far: their places and rows."""

    layout: _Layout
    getters: list[Callable[[Any], Any]]
    places: list[int]
    rows: list[list]

    def add(self, place: int, track: Any) -> bool:
        row = self.layout.row(track, self.getters)
        if row is not None:
            self.places.append(place)
            self.rows.append(row)
        return row is not None

    def group(self, tracks: Sequence[Any]) -> _Group:
        by_position = list(zip(*self.rows, strict=True))
        columns = tuple(_column(by_position[position]) for position, _ in self.layout.leaves)
        return _Group(tracks[self.places[0]], self.layout, tuple(self.places), columns)


def pack(tracks: Sequence[Any]) -> TrackTable | None:
    """The tracks as a table, or ``None`` where one is not a tree of the library's objects."""
    found: list[_Rows] = []
    for place, track in enumerate(tracks):
        if any(rows.add(place, track) for rows in found):  # almost always the first layout
            continue
        layout = _Layout.of(track) if _is_node(track) else None
        if layout is None:
            return None
        found.append(_Rows(layout, [_getter(path) for path, _, _ in layout.nodes], [], []))
        found[-1].add(place, track)  # its own layout
    return TrackTable(tuple(rows.group(tracks) for rows in found), len(tracks))
