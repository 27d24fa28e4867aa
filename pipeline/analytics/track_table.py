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
from operator import attrgetter, itemgetter
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
    """What a track is made of: its objects' classes and attributes, read as one row (the
    values of every object's attributes, breadth first), and which of them are written."""

    leaves: tuple[tuple[int, Path], ...]  # (position in the row, path), the values written
    references: tuple[tuple[Path, str, str], ...]  # (Kalman filter, attribute, refers to)
    read: Callable[[Any], tuple]  # a track's row, in one call
    objects_in: Callable[[tuple], tuple]  # the row's objects below the track
    #: the classes of the track and of those objects, and their numbers of attributes: a track
    #: whose objects have these, every attribute the row reads, and of their own the attributes
    #: their classes have too (which ``read`` would find on the class), has this layout
    kinds: tuple[type, ...]
    counts: tuple[int, ...]
    class_backed: tuple[tuple[int, tuple[str, ...]], ...]  # (object, names), 0: the track

    @staticmethod
    def of(track: Any) -> _Layout | None:
        leaves: list[tuple[int, Path]] = []
        references: list[tuple[Path, str, str]] = []
        objects: list[int] = []  # positions in the row
        kinds: list[type] = []
        counts: list[int] = []
        class_backed: list[tuple[int, tuple[str, ...]]] = []
        paths: list[str] = []
        seen: set[int] = set()
        queue: list[tuple[Any, Path]] = [(track, ())]
        while queue:  # breadth first: the order the row is read in
            node, path = queue.pop(0)
            if id(node) in seen:  # one object reached twice: not a tree
                return None
            seen.add(id(node))
            attributes = vars(node)
            if backed := tuple(name for name in attributes if hasattr(type(node), name)):
                class_backed.append((len(kinds), backed))
            kinds.append(type(node))
            counts.append(len(attributes))
            kalman = (type(node).__module__, type(node).__name__) == _KALMAN
            for name, value in attributes.items():
                position = len(paths)
                paths.append(".".join((*path, name)))
                if _is_node(value):
                    queue.append((value, (*path, name)))
                    objects.append(position)
                elif kalman and name in _REFERENCES and _REFERENCES[name] in attributes:
                    references.append((path, name, _REFERENCES[name]))
                elif not (kalman and name in _SCRATCH):
                    leaves.append((position, (*path, name)))
        return _Layout(
            tuple(leaves),
            tuple(references),
            _tuple_getter(attrgetter, paths),
            _tuple_getter(itemgetter, objects),
            tuple(kinds),
            tuple(counts),
            tuple(class_backed),
        )

    def row(self, track: Any) -> tuple | None:
        """The track's values in this layout's order, or ``None`` where it has another."""
        try:
            row = self.read(track)
        except AttributeError:  # an attribute the layout has is missing
            return None
        objects = (track, *self.objects_in(row))
        if tuple(map(type, objects)) != self.kinds:
            return None
        if tuple(map(len, map(vars, objects))) != self.counts:  # an attribute more
            return None
        for index, names in self.class_backed:  # read from the class, not the object's own
            own = vars(objects[index])
            if not all(name in own for name in names):
                return None
        return row


def _tuple_getter(getter: Callable[..., Callable], keys: Sequence[Any]) -> Callable:
    """``getter(*keys)`` (``attrgetter``, ``itemgetter``), always giving a tuple: for one key
    they give the bare value, and want one at least."""
    if len(keys) > 1:
        return getter(*keys)
    if keys:
        one = getter(keys[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


#: the layouts of tracks met before (a tracker's tracks almost always share one): a track
#: is put in the first whose :meth:`_Layout.row` reads it, found anew where none does
_known_layouts: list[_Layout] = []
_KNOWN_LAYOUTS_KEPT = 8


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
    first = values[0]
    if type(first) is np.ndarray and all(value is first for value in values):
        return None  # one array every track refers to (the model's index arrays)
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
    leaves: tuple[Path, ...]  # the layout's, what ``columns`` are the values of
    references: tuple[tuple[Path, str, str], ...]  # the layout's
    places: tuple[int, ...]
    columns: tuple[np.ndarray | tuple | None, ...]  # one per leaf: see _column

    def tracks(self) -> list:
        tracks = []
        setters = [(_getter(path[:-1]), path[-1]) for path in self.leaves]
        for i in range(len(self.places)):
            track = copy.deepcopy(self.template)
            for (owner, name), column in zip(setters, self.columns, strict=True):
                if column is None:  # the template's, copied
                    continue
                value = column[i]
                value = value.copy() if isinstance(column, np.ndarray) else copy.deepcopy(value)
                setattr(owner(track), name, value)
            for path, name, refers_to in self.references:
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
    places: list[int]
    rows: list[tuple]

    def add(self, place: int, track: Any) -> bool:
        row = self.layout.row(track)
        if row is not None:
            self.places.append(place)
            self.rows.append(row)
        return row is not None

    def group(self, tracks: Sequence[Any]) -> _Group:
        by_position = list(zip(*self.rows, strict=True))
        leaves = self.layout.leaves
        columns = tuple(_column(by_position[position]) for position, _ in leaves)
        template = tracks[self.places[0]]
        paths = tuple(path for _, path in leaves)
        return _Group(template, paths, self.layout.references, tuple(self.places), columns)


def _layout_for(track: Any) -> _Layout | None:
    for layout in _known_layouts:
        if layout.row(track) is not None:
            return layout
    layout = _Layout.of(track) if _is_node(track) else None
    if layout is not None:
        _known_layouts.insert(0, layout)
        del _known_layouts[_KNOWN_LAYOUTS_KEPT:]
    return layout


def pack(tracks: Sequence[Any]) -> TrackTable | None:
    """The tracks as a table, or ``None`` where one is not a tree of the library's objects."""
    found: list[_Rows] = []
    for place, track in enumerate(tracks):
        if any(rows.add(place, track) for rows in found):  # almost always the first layout
            continue
        layout = _layout_for(track)
        if layout is None:
            return None
        found.append(_Rows(layout, [], []))
        found[-1].add(place, track)  # its own layout
    return TrackTable(tuple(rows.group(tracks) for rows in found), len(tracks))
