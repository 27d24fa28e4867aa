"""What the HTTP API and the metrics see of a running pipeline, and how they steer it.

The supervisor thread owns the decoders and the batch workers; requests from the HTTP server's
thread are queued here as :class:`Command` s and carried out by the supervisor on its next tick
(every 0.2 s), their results handed back through a future. Reads (camera list, states, decoded
counts) come from thread-safe snapshots: the accounting and :class:`CameraStates`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import redis

from pipeline.ledger.accounting import Accounting
from pipeline.ledger.summary import CameraSummary
from streams.keys import StreamKeys
from streams.urls import redact_url

COMMAND_TIMEOUT_S = 10.0
RECENT_FRAMES = 1000  # latency percentiles of the API and the view: each camera's newest frames
RATE_WINDOW_S = 5.0
#: decoder status events -> camera state (``framebatch_camera_state``)
EVENT_STATES = {
    "opened": "running",
    "reconnecting": "reconnecting",
    "error": "failed",
    "ended": "ended",
    "crashed": "failed",
}


class CameraNotFound(KeyError):
    """No camera with this id in the run."""


class CameraConflict(ValueError):
    """The request cannot be carried out in the camera's current state or config."""


@dataclass(frozen=True)
class CameraView:
    """One camera as the API lists it."""

    id: str
    url: str  # password redacted
    state: str
    priority: int
    live: bool  # a network camera (RTSP); False for a video file
    realtime: bool  # frames at the source's pace: a live camera, or a file with realtime: true
    decoded: int
    processed: int
    dropped: dict[str, int]
    fps: float  # frames processed a second over the last few seconds
    latency_p50_s: float | None
    latency_p99_s: float | None


@dataclass
class _Camera:
    url: str
    priority: int
    live: bool
    realtime: bool
    state: str = "starting"
    rates: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))


class CameraStates:
    """Each camera's state, priority and recent throughput; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._lock = threading.Lock()
        self._cameras: dict[str, _Camera] = {}
        self._clock = clock

    def add(
        self, camera: str, url: str, priority: int, live: bool, realtime: bool | None = None
    ) -> None:
        """``live``: a network camera; ``realtime``: the config's setting (a file replayed at
        its frame rate); a live camera is always real-time."""
        with self._lock:
            self._cameras[camera] = _Camera(redact_url(url), priority, live, live or bool(realtime))

    def set(self, camera: str, state: str) -> None:
        with self._lock:
            if camera in self._cameras and self._cameras[camera].state != "removed":
                self._cameras[camera].state = state

    def on_event(self, event: Mapping[str, str]) -> None:
        """A decoder status event (``streams.events``); a source that failed and then ended
        stays ``failed``."""
        state = EVENT_STATES.get(event.get("event", ""))
        camera = event.get("camera", "")
        current = self.state(camera)
        if state == "ended" and current in ("failed", "draining"):
            return  # draining ends as removed, once its frames are all counted
        if state == "failed" and current in ("restarting", "draining"):
            return  # the crash the supervisor already acted on (a restart, or a removal)
        if state is not None:
            self.set(camera, state)

    def set_priority(self, camera: str, priority: int) -> None:
        with self._lock:
            self._cameras[camera].priority = priority

    def state(self, camera: str) -> str | None:
        with self._lock:
            entry = self._cameras.get(camera)
            return entry.state if entry else None

    def states(self) -> dict[str, str]:
        with self._lock:
            return {camera: entry.state for camera, entry in self._cameras.items()}

    def sample(self, processed: Mapping[str, int]) -> None:
        """Processed counts now (the supervisor's tick): the base of each camera's fps."""
        now = self._clock()
        with self._lock:
            for camera, count in processed.items():
                if camera in self._cameras:
                    self._cameras[camera].rates.append((now, count))

    def views(self, summaries: Mapping[str, CameraSummary]) -> list[CameraView]:
        now = self._clock()
        with self._lock:
            return [
                _view(camera, entry, summaries.get(camera), now)
                for camera, entry in self._cameras.items()
            ]


def _view(camera: str, entry: _Camera, summary: CameraSummary | None, now: float) -> CameraView:
    recent = [(t, n) for t, n in entry.rates if now - t <= RATE_WINDOW_S]
    fps = 0.0
    if entry.state != "removed" and len(recent) >= 2 and recent[-1][0] > recent[0][0]:
        fps = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
    return CameraView(
        id=camera,
        url=entry.url,
        state=entry.state,
        priority=entry.priority,
        live=entry.live,
        realtime=entry.realtime,
        decoded=summary.decoded if summary else 0,
        processed=summary.processed if summary else 0,
        dropped=dict(summary.dropped) if summary else {},
        fps=round(fps, 3),
        latency_p50_s=summary.latency_p50_s if summary else None,
        latency_p99_s=summary.latency_p99_s if summary else None,
    )


@dataclass(frozen=True)
class Command:
    """A change the supervisor carries out: ``apply`` runs on its thread."""

    apply: Callable[[], Any]
    result: Future = field(default_factory=Future)


class Control:
    """The running pipeline as the HTTP API and the metrics collector see it."""

    def __init__(
        self,
        *,
        accounting: Accounting,
        states: CameraStates,
        redis_client: redis.Redis,
        keys: StreamKeys,
        max_silence_s: float = 5.0,
    ):
        """``max_silence_s``: how long the supervisor may go without a tick and still count as
        alive (it waits out Redis outages inside a tick)."""
        self.accounting = accounting
        self.states = states
        self._redis = redis_client
        self._keys = keys
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._lock = threading.Lock()  # a command is queued only while the run takes them
        self.ready = threading.Event()  # model loaded, warmed up, batchers running
        self._alive_at: float | None = None  # the supervisor's last tick; None before the first
        self._max_silence_s = max_silence_s
        self._stopped = False

    # --- the supervisor's side -----------------------------------------------------------
    def tick(self) -> None:
        """The supervisor is alive; carry out the queued commands on its thread."""
        self._alive_at = time.monotonic()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if not command.result.set_running_or_notify_cancel():
                continue
            try:
                command.result.set_result(command.apply())
            except Exception as exc:  # noqa: BLE001 - handed back to the requester
                command.result.set_exception(exc)

    def stopped(self) -> None:
        """The run ends: queued and later commands fail at once."""
        with self._lock:
            self._stopped = True
        self.ready.clear()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command.result.set_running_or_notify_cancel():  # not given up by its requester
                command.result.set_exception(CameraConflict("the pipeline is stopping"))

    # --- the requesters' side ------------------------------------------------------------
    def submit(self, apply: Callable[[], Any], timeout_s: float = COMMAND_TIMEOUT_S) -> Any:
        """Run ``apply`` on the supervisor's thread and return its result (or raise its error)."""
        command = Command(apply)
        with self._lock:
            if self._stopped:
                raise CameraConflict("the pipeline is stopping")
            self._commands.put(command)
        try:
            return command.result.result(timeout_s)
        except FutureTimeout:
            if command.result.cancel():  # not started: it never will be
                raise TimeoutError("the pipeline did not take the request in time") from None
            return command.result.result()  # started: its outcome is the answer

    def alive(self) -> bool:
        """The supervisor ticks (or has not started yet: the model loads)."""
        if self._alive_at is None:
            return not self._stopped
        return time.monotonic() - self._alive_at <= self._max_silence_s

    def redis_reachable(self) -> bool:
        try:
            return bool(self._redis.ping())
        except redis.RedisError:
            return False

    def cameras(self) -> list[CameraView]:
        summaries = {c.camera: c for c in self.accounting.summary(RECENT_FRAMES).cameras}
        return self.states.views(summaries)

    def camera(self, camera: str) -> CameraView:
        for view in self.cameras():
            if view.id == camera:
                return view
        raise CameraNotFound(camera)

    # --- metrics.PipelineState -----------------------------------------------------------
    def camera_states(self) -> Mapping[str, str]:
        return self.states.states()

    def frames_decoded(self) -> Mapping[str, int]:
        return self.accounting.decoded_counts()

    def stream_backlog(self) -> Mapping[str, int] | None:
        cameras = [c for c, s in self.states.states().items() if s != "removed"]
        try:
            pipe = self._redis.pipeline(transaction=False)
            for camera in cameras:
                pipe.xlen(self._keys.frames(camera))
            return dict(zip(cameras, pipe.execute(), strict=True))
        except redis.RedisError:
            return None
