"""A camera's analytics state in Redis, beside its frames: ``<prefix>:analytics:{<camera>}``.

The state is written in the same round trip as the acknowledgement of the frames it has seen,
and with their events (:meth:`pipeline.ledger.acks.FrameAcks.acknowledge_frames`): a worker that
dies before that leaves the frames pending, and the worker that claims them analyses them again
from the state before them, so tracks keep their ids and nothing is counted twice.

The state is pickled: it holds the tracker library's own objects (Kalman filters), which have no
other serialisation.  Redis is inside framebatch's trust boundary (it carries the frames and
commands the workers), so unpickling what framebatch wrote there adds no exposure; a state of
another version (an upgrade of framebatch or of ``trackers``) is not unpickled at all: the
camera's tracks start over, said in the log.
"""

from __future__ import annotations

import logging
import pickle
import zlib
from importlib.metadata import version

import redis

from pipeline.analytics.state import CameraState
from streams.keys import StreamKeys

log = logging.getLogger(__name__)

STATE_VERSION = 1
_HEADER = f"framebatch-analytics/{STATE_VERSION}/trackers-{version('trackers')}\n".encode()


def dump_state(state: CameraState) -> bytes:
    # level 1: the Kalman matrices shrink about 3x for a few µs per track
    return _HEADER + zlib.compress(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), 1)


def load_state(blob: bytes) -> CameraState | None:
    """The state, or None for one written by another version."""
    if not blob.startswith(_HEADER):
        return None
    state = pickle.loads(zlib.decompress(blob[len(_HEADER) :]))
    return state if isinstance(state, CameraState) else None


class AnalyticsStore:
    """Reads cameras' states (writes go with the acknowledgements)."""

    def __init__(self, redis_client: redis.Redis, keys: StreamKeys):
        self._redis = redis_client
        self._keys = keys

    def load(self, camera: str) -> CameraState | None:
        blob = self._redis.get(self._keys.analytics_state(camera))
        if blob is None:
            return None
        state = load_state(blob)
        if state is None:
            header = blob.split(b"\n", 1)[0][:80].decode(errors="replace")
            log.warning(
                "camera %s: analytics state of another version (%s): its tracks start over",
                camera,
                header,
            )
        return state
