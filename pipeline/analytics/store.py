"""A camera's analytics state in Redis, beside its frames: ``<prefix>:analytics:{<camera>}``.

The state is written in the same round trip as the acknowledgement of the frames it has seen,
and with their events (:meth:`pipeline.ledger.acks.FrameAcks.acknowledge_frames`): a worker that
dies before that leaves the frames pending, and the worker that claims them analyses them again
from the state before them, so tracks keep their ids and nothing is counted twice.

The state is pickled: it holds the tracker library's own objects (Kalman filters), which have no
other serialisation.  Redis is inside framebatch's trust boundary (it carries the frames and
commands the workers), so unpickling what framebatch wrote there adds no exposure; a state of
another version (of framebatch or of ``trackers``), or one that does not unpickle, is not used:
the camera's tracks start over, said in the log.

The tracker's tracks are written as a table (:mod:`pipeline.analytics.track_table`: one track
as it is, the others' values in columns), not one by one: 50 tracks took 1.9 ms to write. Arrays
are written as raw bytes, and one equal to an array written before as a copy of it.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import pickle
import zlib
from importlib.metadata import version
from operator import attrgetter
from typing import Any

import numpy as np
import redis

from pipeline.analytics import track_table
from pipeline.analytics.state import CameraState, TrackInfo
from pipeline.analytics.zones import Visit
from pipeline.ledger.acks import kept_state
from streams.keys import StreamKeys

log = logging.getLogger(__name__)

STATE_VERSION = 4
_HEADER = (
    f"framebatch-analytics/{STATE_VERSION}/framebatch-{version('framebatch')}"
    f"/trackers-{version('trackers')}\n"
).encode()


def _array(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _copy_of(array: np.ndarray) -> np.ndarray:
    return array.copy()  # never shared after loading: the tracker updates arrays in place


#: what a camera keeps one of per track, written as its class and fields (pickle's own way
#: for an object, through ``copyreg``, took 0.03-0.07 ms a frame at 50 tracks)
_BY_FIELDS = {
    kind: attrgetter(*(f.name for f in dataclasses.fields(kind))) for kind in (TrackInfo, Visit)
}


def _with_tracks(tracker: Any, table: track_table.TrackTable) -> Any:
    tracker.tracks = table.unpack()
    return tracker


class _StatePickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, tracker: Any):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._written: dict[tuple[str, tuple[int, ...], bytes], np.ndarray] = {}
        self._tracker = tracker  # whose tracks go in a table

    def reducer_override(self, obj: Any) -> Any:
        if obj is self._tracker and (table := track_table.pack(obj.tracks)) is not None:
            rest = copy.copy(obj)  # the tracker's own settings and counters, pickled as usual
            rest.tracks = []
            return _with_tracks, (rest, table)
        if (fields_of := _BY_FIELDS.get(type(obj))) is not None:
            return type(obj), fields_of(obj)
        if type(obj) is not np.ndarray or obj.dtype.hasobject:
            return NotImplemented
        key = (obj.dtype.str, obj.shape, obj.tobytes())
        first = self._written.setdefault(key, obj)
        if first is not obj:
            return _copy_of, (first,)
        return _array, (key[2], key[0], key[1])


def dump_state(state: CameraState) -> bytes:
    buffer = io.BytesIO()
    tracker = state.tracker.tracker if state.tracker is not None else None
    _StatePickler(buffer, tracker).dump(state)
    # level 1: what is left (mostly the tracks' own numbers) shrinks about 5x for ~0.1 ms
    return _HEADER + zlib.compress(buffer.getvalue(), 1)


class StateUnreadable(Exception):
    """A state blob this version cannot use; the message says why."""


def load_state(blob: bytes) -> CameraState:
    if not blob.startswith(_HEADER):
        header = blob.split(b"\n", 1)[0][:120].decode(errors="replace")
        raise StateUnreadable(f"written by another version ({header})")
    try:
        state = pickle.loads(zlib.decompress(blob[len(_HEADER) :]))
    except Exception as exc:  # a cut or damaged value: whatever unpickling raises
        raise StateUnreadable(f"unreadable ({type(exc).__name__}: {exc})"[:200]) from None
    if not isinstance(state, CameraState):
        raise StateUnreadable(f"not a camera state ({type(state).__name__})")
    return state


class AnalyticsStore:
    """Reads cameras' states (writes go with the acknowledgements)."""

    def __init__(self, redis_client: redis.Redis, keys: StreamKeys):
        self._redis = redis_client
        self._keys = keys

    def load(self, camera: str) -> CameraState | None:
        blob = self._redis.get(self._keys.analytics_state(camera))
        if blob is None:
            return None
        try:
            return load_state(kept_state(blob))
        except StateUnreadable as exc:
            log.warning("camera %s: analytics state %s: its tracks start over", camera, exc)
            return None
