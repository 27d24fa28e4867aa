"""Per-camera frame queues shared by every batching policy: priorities, fairness, freshness, bounds.

* **Priority levels**: level 0 is served first, then 1, and so on.  Under overload (more frames
  waiting than ``max_waiting``) the lowest level loses frames first (cause ``overflow``).
* **Fairness** within a level is deficit round-robin with a quantum of one frame: each round takes
  one frame from every waiting camera, starting with the camera served least recently, so no
  camera starves and a hot camera only fills the slots the others leave empty.
* **Windows**: a frame must be dispatched ``window`` after it arrived, where the window is
  ``max_wait_frames`` of the camera's *measured* frame interval, capped by ``max_wait_ms``.
* **Freshness**: a frame whose ``max_frame_age_ms`` (from capture) would pass before its batch
  could finish is dropped before inference (cause ``stale``; the policy sizes the batch to the
  deadlines first, see ``BatchPolicy.fresh_size``); ``keep_latest`` cameras keep only
  their newest frame (cause ``superseded``).
* Each camera's frames leave in arrival order.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

RATE_SMOOTHING = 0.1  # EWMA weight of a new frame interval
IDLE_CAMERA_S = 2.0  # a camera silent this long no longer counts towards the arrival rate
RATE_REFRESH_S = 0.1  # the summed arrival rate moves slowly: recompute it at most this often


@dataclass(frozen=True)
class CameraRules:
    """How one camera's frames are batched."""

    priority: int = 0  # 0 is the most important level
    max_wait_frames: float | None = 2.0  # window in frame intervals (None: max_wait_ms only)
    max_wait_ms: float = 50.0  # cap of the window; the window itself when fps is unknown
    max_frame_age_ms: float | None = None  # freshness deadline from capture (live sources)
    keep_latest: bool = False  # only the newest frame matters: older queued ones are dropped
    fps: float | None = None  # prior for the frame rate until it is measured
    # a file job paced by backpressure: its frames come as fast as they are taken, so its
    # measured rate says nothing of its demand (which is: as many as the detector can take)
    backlogged: bool = False


@dataclass(frozen=True)
class Queued(Generic[T]):
    camera: str
    seq: int
    captured: float  # when the frame was captured (clock of the decoder)
    arrived: float  # when the batcher received it
    dispatch_by: float  # arrived + the camera's window
    expires: float | None  # captured + max_frame_age, if the camera has one
    item: T


@dataclass(frozen=True)
class Dropped(Generic[T]):
    frame: Queued[T]
    cause: str  # "stale", "superseded" or "overflow"


@dataclass
class _Camera(Generic[T]):
    rules: CameraRules
    queue: deque[Queued[T]] = field(default_factory=deque)
    interval_s: float | None = None  # smoothed interval between captures
    last_captured: float | None = None
    last_arrived: float = float("-inf")

    @property
    def fps(self) -> float | None:
        if self.interval_s:
            return 1.0 / self.interval_s
        return self.rules.fps

    def window_s(self) -> float:
        cap = self.rules.max_wait_ms / 1000
        fps = self.fps
        if self.rules.max_wait_frames is None or not fps:
            return cap
        return min(self.rules.max_wait_frames / fps, cap)

    def observe_capture(self, captured: float) -> None:
        if self.last_captured is not None and captured > self.last_captured:
            interval = captured - self.last_captured
            if self.interval_s is None:
                self.interval_s = interval
            else:
                self.interval_s += RATE_SMOOTHING * (interval - self.interval_s)
        self.last_captured = captured


#: the least room the queue keeps per camera: one frame being read on top of one waiting
QUEUE_FRAMES_PER_CAMERA = 2
QUEUE_BATCHES = 4  # frames held by default, in batches of the largest size


def queue_bound(max_batch_size: int, cameras: int, max_queue_frames: int | None = None) -> int:
    """Frames the batching queue holds at most: ``max_queue_frames`` (default
    ``QUEUE_BATCHES`` full batches), and room for a read of one frame per camera on top of one
    waiting (``QUEUE_FRAMES_PER_CAMERA``), as :meth:`FrameQueues.make_room` keeps."""
    least = QUEUE_FRAMES_PER_CAMERA * cameras
    return max(max_queue_frames or QUEUE_BATCHES * max_batch_size, least)


class FrameQueues(Generic[T]):
    """The frames waiting for a batch, one queue per camera."""

    def __init__(
        self,
        *,
        max_waiting: int,
        default_rules: CameraRules = CameraRules(),
        rules: Mapping[str, CameraRules] | None = None,
    ):
        if max_waiting < 1:
            raise ValueError("max_waiting must be >= 1")
        self.max_waiting = max_waiting
        self._default_rules = default_rules
        self._rules = dict(rules or {})
        self._cameras: dict[str, _Camera[T]] = {}
        # per level, cameras in least-recently-served order (the round-robin pointer)
        self._levels: dict[int, OrderedDict[str, None]] = {}
        self._waiting = 0
        # Minimum of dispatch_by / arrived / expires over waiting frames: lowered on add,
        # forgotten (recomputed on demand) when frames leave. Frames leave once per batch but
        # polls come once per frame, so polls need not scan every queue at 1000 cameras.
        self._minimum: dict[str, float | None] = {}
        self._rate: tuple[float, float] | None = None  # (computed at, frames/s)

    # --- state ---------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return self._waiting

    def camera(self, camera: str) -> _Camera[T]:
        state = self._cameras.get(camera)
        if state is None:
            rules = self._rules.get(camera, self._default_rules)
            state = self._cameras[camera] = _Camera(rules)
            self._levels.setdefault(rules.priority, OrderedDict())[camera] = None
        return state

    def arrival_rate(self, now: float) -> float:
        """Frames per second arriving from cameras heard from recently (measured rates);
        infinite while a backlogged file job is among them."""
        if self._rate is None or not 0 <= now - self._rate[0] < RATE_REFRESH_S:
            recent = [s for s in self._cameras.values() if now - s.last_arrived <= IDLE_CAMERA_S]
            if any(state.rules.backlogged for state in recent):
                rate = math.inf
            else:
                rate = sum(state.fps or 0.0 for state in recent)
            self._rate = (now, rate)
        return self._rate[1]

    def _min_time(self, name: str) -> float | None:
        if name not in self._minimum:
            times = [
                t
                for state in self._cameras.values()
                for q in state.queue
                if (t := getattr(q, name)) is not None
            ]
            self._minimum[name] = min(times) if times else None
        return self._minimum[name]

    def oldest_arrival(self) -> float | None:
        return self._min_time("arrived")

    def earliest_dispatch_by(self) -> float | None:
        # over all frames, not just heads: a camera's window shrinks as its rate is measured,
        # so a later frame can be due first (and then takes the older ones with it, in order)
        return self._min_time("dispatch_by")

    def any_due(self, now: float) -> bool:
        """Whether some frame's window has closed at ``now``."""
        earliest = self.earliest_dispatch_by()
        return earliest is not None and earliest <= now

    def due(self, now: float) -> int:
        """Frames whose window has closed at ``now``."""
        return sum(1 for s in self._cameras.values() for q in s.queue if q.dispatch_by <= now)

    # --- changes -------------------------------------------------------------------------------
    def make_room(self, cameras: int) -> None:
        """Hold at least ``QUEUE_FRAMES_PER_CAMERA`` frames per camera read: a reader reads at
        least one frame of each stream at a time, so a queue smaller than that (cameras added
        while running) would never let it read again."""
        self.max_waiting = max(self.max_waiting, QUEUE_FRAMES_PER_CAMERA * cameras)

    def set_rules(self, camera: str, rules: CameraRules) -> None:
        """A camera added or changed while running: its rules from now on (frames waiting keep
        their window; a new priority level applies to the next batch)."""
        self._rules[camera] = rules
        state = self._cameras.get(camera)
        if state is None:
            return
        self._levels[state.rules.priority].pop(camera, None)
        state.rules = rules
        self._levels.setdefault(rules.priority, OrderedDict())[camera] = None
        self._rate = None

    def add(self, camera: str, seq: int, captured: float, item: T, now: float) -> list[Dropped[T]]:
        state = self.camera(camera)
        state.observe_capture(captured)
        state.last_arrived = now
        dropped: list[Dropped[T]] = []
        if state.rules.keep_latest and state.queue:
            dropped += [Dropped(q, "superseded") for q in state.queue]
            self._waiting -= len(state.queue)
            state.queue.clear()
            self._minimum.clear()
        max_age = state.rules.max_frame_age_ms
        state.queue.append(
            Queued(
                camera=camera,
                seq=seq,
                captured=captured,
                arrived=now,
                dispatch_by=now + state.window_s(),
                expires=None if max_age is None else captured + max_age / 1000,
                item=item,
            )
        )
        self._waiting += 1
        self._lower_minimums(state.queue[-1])
        while self._waiting > self.max_waiting:
            dropped.append(Dropped(self._evict(), "overflow"))
        return dropped

    def _lower_minimums(self, frame: Queued[T]) -> None:
        for name, known in self._minimum.items():
            value = getattr(frame, name)
            if value is not None and (known is None or value < known):
                self._minimum[name] = value

    def _evict(self) -> Queued[T]:
        """The oldest frame of the longest queue in the least important level that has frames."""
        for level in sorted(self._levels, reverse=True):
            queues = [self._cameras[c].queue for c in self._levels[level] if self._cameras[c].queue]
            if queues:
                self._waiting -= 1
                frame = max(queues, key=len).popleft()
                for name, known in list(self._minimum.items()):
                    if getattr(frame, name) == known:  # only a minimum it held goes stale
                        del self._minimum[name]
                return frame
        raise RuntimeError("evict called with nothing waiting")

    def expires_before(self, finish: float) -> bool:
        """Whether some waiting frame's freshness deadline passes before ``finish``."""
        earliest = self._min_time("expires")
        return earliest is not None and earliest < finish

    def deadlines(self) -> list[float]:
        """The freshness deadlines of the waiting frames that have one, sorted."""
        return sorted(
            q.expires
            for state in self._cameras.values()
            if state.rules.max_frame_age_ms is not None
            for q in state.queue
            if q.expires is not None
        )

    def expire(self, start: float, service_s: float) -> list[Dropped[T]]:
        """Drop frames that cannot make their freshness deadline in a batch that starts at
        ``start`` and takes ``service_s``."""
        dropped: list[Dropped[T]] = []
        finish = start + service_s
        earliest = self._min_time("expires")
        if earliest is None or earliest >= finish:
            return dropped
        self._minimum.clear()
        for state in self._cameras.values():
            # queues are in capture order, so stale frames are at the head
            while (
                state.queue
                and state.queue[0].expires is not None
                and state.queue[0].expires < finish
            ):
                dropped.append(Dropped(state.queue.popleft(), "stale"))
                self._waiting -= 1
        return dropped

    def take(self, count: int) -> list[Queued[T]]:
        """Up to ``count`` frames: levels in order; round-robin within a level, least recently
        served camera first; each camera's frames in order."""
        batch: list[Queued[T]] = []
        for level in sorted(self._levels):
            order = self._levels[level]
            while len(batch) < count:
                served = []
                for camera in order:
                    queue = self._cameras[camera].queue
                    if queue and len(batch) < count:
                        batch.append(queue.popleft())
                        served.append(camera)
                if not served:
                    break
                for camera in served:  # served cameras go to the back of the round-robin
                    order.move_to_end(camera)
        self._waiting -= len(batch)
        if batch:
            self._minimum.clear()
        return batch

    def discard(self, camera: str) -> list[Queued[T]]:
        """Let go of a camera now, with the frames it has waiting (another worker took it
        over: they are that worker's to process); returns them."""
        state = self._cameras.pop(camera, None)
        if state is None:
            return []
        self._levels[state.rules.priority].pop(camera, None)
        frames = list(state.queue)
        self._waiting -= len(frames)
        self._minimum.clear()
        self._rate = None
        return frames

    def forget_idle(self, now: float, idle_s: float = 60.0) -> None:
        """Let go of cameras that left (no frames for ``idle_s``, nothing queued)."""
        for camera, state in list(self._cameras.items()):
            if not state.queue and now - state.last_arrived > idle_s:
                del self._cameras[camera]
                self._levels[state.rules.priority].pop(camera, None)
