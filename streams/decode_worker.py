"""Decode worker: one per camera, a thread of a decode process (:mod:`streams.decode_process`);
source → letterbox → ``XADD`` frames.

Live cameras keep the freshest frames: the frames stream is capped with an exact ``MAXLEN`` and the
batcher counts what the cap trimmed as ``overflow`` drops (by gaps in ``seq``).  File jobs apply
backpressure instead: the worker waits while the camera's backlog is full, so nothing drops.
Every session ends with an :class:`EndOfStream` entry that says how many frames were decoded.
Pixels travel as the configured transport's encoder makes them (:mod:`streams.transport`).
"""

from __future__ import annotations

import ctypes
import logging
import math
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import redis

from streams.events import EventLog
from streams.fence import DecodeLease, SessionFence
from streams.keys import StreamKeys
from streams.messages import EndOfStream, FrameMessage, new_session_id
from streams.redis_errors import OUTAGE_ERRORS
from streams.sampling import DecodeFrames, DecodeGate, FrameSampler
from streams.sources import DecodedFrame, SourceError, VideoSource
from streams.transport import FrameEncoder, RawEncoder
from streams.urls import redact_url

log = logging.getLogger(__name__)

BACKPRESSURE_POLL_S = 0.02  # a full backlog lasts seconds; polling faster only burns CPU
LINGER_POLL_S = 0.05
REDIS_RETRY_MIN_S, REDIS_RETRY_MAX_S = 0.25, 2.0  # live frames shed untried between tries
LINGER_IDLE_S = 10.0  # a ring outlives its decoder while its frames are read, but not forever


class StopSignal(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class ProcessFlag:
    """A stop signal a supervisor shares with its decode processes, safe when one is killed.

    ``multiprocessing.Event`` is a condition variable whose ``set()`` waits for every sleeper to
    wake: a decoder SIGKILLed inside ``wait()`` (where a paced decoder spends most of its time)
    hangs the supervisor's ``set()`` forever.  This is one shared byte without a lock (a byte
    store is atomic); ``wait`` looks at it every ``poll_s``."""

    def __init__(self, poll_s: float = 0.02):
        self._flag = multiprocessing.get_context("spawn").RawValue(ctypes.c_bool, False)
        self._poll_s = poll_s

    def set(self) -> None:
        self._flag.value = True

    def is_set(self) -> bool:
        return self._flag.value

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._flag.value:
            remaining = self._poll_s if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(remaining, self._poll_s))  # the wait primitive itself
        return True


class PreparedImage(Protocol):
    """What a frame preparer returns (``detectors.preprocess.Letterboxed`` fits)."""

    pixels: np.ndarray
    geometry: object  # has width, height, scale, pad_x, pad_y


FramePreparer = Callable[[np.ndarray], PreparedImage]


@dataclass(frozen=True)
class DecoderSpec:
    """Everything one decode worker needs to know about its camera."""

    camera: str
    url: str
    live: bool
    realtime: bool  # pace files at their frame rate, like a camera
    loop: bool
    backpressure: bool  # wait for room instead of letting MAXLEN trim unread frames
    max_backlog: int
    fps: float | None = None  # overrides the container's frame rate for pacing
    vid_stride: int = 1  # take every n-th decoded frame
    max_fps: float | None = None  # take at most this many frames a second of stream time
    decode_frames: DecodeFrames = "auto"  # all, key frames only, or auto (sampling.DecodeGate)
    decode_threads: int = 0  # 0: FFmpeg's frame threading; 1: decode on the worker's thread
    open_timeout_s: float = 5.0
    read_timeout_s: float = 5.0
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 10.0
    #: decoded under a decode worker's lease: every write fenced (``streams.fence``)
    lease: DecodeLease | None = None

    @property
    def file_job(self) -> bool:
        """A finite file, decoded once: never restarted, nor handed over halfway."""
        return not (self.live or self.loop)


def video_source(spec: DecoderSpec) -> VideoSource:
    """The camera's source, not opened yet."""
    return VideoSource(
        spec.camera,
        spec.url,
        open_timeout_s=spec.open_timeout_s,
        read_timeout_s=spec.read_timeout_s,
        decode_threads=spec.decode_threads,
    )


class DecodeWorker:
    """Reads one source and publishes its frames until it ends or ``stop`` is set."""

    def __init__(
        self,
        *,
        spec: DecoderSpec,
        redis_client: redis.Redis,
        keys: StreamKeys,
        prepare: FramePreparer,
        encoder: FrameEncoder | None = None,
        clock: Callable[[], float] = time.time,
        fail_fast_client: redis.Redis | None = None,
        open_source: Callable[[DecoderSpec], VideoSource] | None = None,
        session: str | None = None,
        worker_alive: Callable[[], bool] = lambda: True,
    ):
        """``encoder``: how pixels travel (default raw inline); the caller closes it.
        ``open_source`` makes each connection's source (default :func:`video_source`).
        ``session``: the session's id, claimed already (under a lease); default a new one.
        ``worker_alive``: whether the decode worker whose lease this runs under lives (a
        lease that ran out is taken back only then: ``SessionFence``).

        ``redis_client`` retries through Redis outages (a file job pauses); a camera that
        keeps the freshest frames (no backpressure) sends them with ``fail_fast_client``
        instead and sheds what Redis cannot take now, counted as ``redis_down``."""
        self.spec = spec
        self._redis = redis_client
        self._sheds = not spec.backpressure
        self._frames_redis = (fail_fast_client or redis_client) if self._sheds else redis_client
        self._keys = keys
        self._stream_key = keys.frames(spec.camera)
        self._prepare = prepare
        self._encoder = encoder or RawEncoder()
        self._clock = clock
        self._open_source = open_source or video_source
        self._events = EventLog(self._frames_redis, keys)  # best effort, never waits long
        # with seq, names each frame uniquely across restarts
        self.session = session or new_session_id()
        self.seq = 0
        self.decode_errors = 0
        self.redis_down = 0  # frames shed while Redis was unreachable (their seq is used up)
        self.sampled_out = 0  # frames not taken (vid_stride, max_fps): no seq
        self.not_decoded = 0  # of those, skipped as packets (key frames only)
        self._sampler = FrameSampler(vid_stride=spec.vid_stride, max_fps=spec.max_fps)
        # across reconnections and loops: the GOP it measured stays true of the camera
        self._gate = DecodeGate(
            spec.decode_frames,
            max_fps=spec.max_fps,
            vid_stride=spec.vid_stride,
            sampler=self._sampler,
        )
        self._redis_retry_at = 0.0  # while Redis is away, frames before this shed untried
        self._redis_backoff_s = REDIS_RETRY_MIN_S
        self._room = 0  # frames that may still be added before asking XLEN again
        self._fence = (
            None
            if spec.lease is None
            else SessionFence(
                redis_client,
                keys,
                spec.camera,
                spec.lease,
                final=spec.file_job,
                worker_alive=worker_alive,
            )
        )

    def run(self, stop: StopSignal) -> EndOfStream:
        """Decode until the source ends (files), ``stop`` is set, or a file fails; raises
        ``LeaseLost`` (fenced) once another decode worker ended the session."""
        spec = self.spec
        backoff = spec.reconnect_initial_s
        reason, error = "stopped", ""
        while not stop.is_set():
            source = self._open_source(spec)
            connected = False
            try:
                with source:
                    connected = True
                    self._events.emit(spec.camera, "opened", redact_url(spec.url))
                    backoff, error = spec.reconnect_initial_s, ""
                    self._publish_frames(source, stop)
            except SourceError as exc:
                if spec.live and connected and stop.is_set():
                    # The stop came while a read waited on a stalled stream (a blocked read only
                    # returns at its timeout): the camera was connected when it was stopped.
                    self._events.emit(spec.camera, "stalled", f"while stopping: {exc}")
                    break
                error = str(exc)
                self._events.emit(spec.camera, "error", error)
                if not spec.live:
                    reason = "error"
                    break
            finally:
                self.decode_errors += source.decode_errors
            if stop.is_set():
                break
            if spec.live:  # a live source that ended, quietly or not, is a disconnect
                self._events.emit(spec.camera, "reconnecting", f"retry in {backoff:.1f}s")
                stop.wait(backoff)
                backoff = min(backoff * 2, spec.reconnect_max_s)
            elif not spec.loop:
                reason, error = "eof", ""
                break
        end = EndOfStream(
            spec.camera,
            self.seq,
            reason,
            error,
            self.decode_errors,
            session=self.session,
            redis_down=self.redis_down,
            sampled_out=self.sampled_out,
        )
        if self._fence is not None:
            self._fence.end(self._redis, end)
        else:
            pipe = self._redis.pipeline(transaction=False)
            pipe.xadd(self._stream_key, end.to_fields())
            pipe.delete(self._keys.progress(spec.camera))  # the end entry says it all now
            pipe.execute()
        self._events.emit(
            spec.camera, "ended", f"{reason}: {self.seq} frames", reason=reason, frames=self.seq
        )
        return end

    def _publish_frames(self, source: VideoSource, stop: StopSignal) -> None:
        fps = self.spec.fps or source.fps or 30.0
        started = self._clock()
        try:
            for index, decoded in enumerate(source.frames(self._gate)):
                if not self._publish_frame(decoded, index + source.skipped, started, fps, stop):
                    return
        finally:  # frames never decoded: as sampled out, from their packets
            self.sampled_out += source.skipped
            self.not_decoded += source.skipped

    def _publish_frame(
        self, decoded: DecodedFrame, position: int, started: float, fps: float, stop: StopSignal
    ) -> bool:
        """``position``: the frame's place in the stream (decoded and skipped); False: stop."""
        if stop.is_set():
            return False
        if self.spec.realtime:
            due = started + position / fps  # paced by the stream's frames, taken or not
            delay = due - self._clock()
            if delay > 0 and stop.wait(delay):
                return False
        captured = self._clock()
        stream_time = decoded.pts if decoded.pts is not None else captured
        if not self._sampler.take(stream_time):
            self.sampled_out += 1
            return True
        if self._sheds and captured < self._redis_retry_at:
            self._shed_for_redis()  # Redis is away: the freshest frames matter, not these
            return True
        if self._sheds:
            try:
                behind = self._behind()
            except OUTAGE_ERRORS:
                self._redis_failed()
                return True
            if behind:
                self.seq += 1  # a gap, counted as overflow like a frame MAXLEN trimmed
                return True
        prepared = self._prepare(decoded.image)
        if self.spec.backpressure and not self._wait_for_room(stop):
            return False
        geometry = prepared.geometry
        height, width = prepared.pixels.shape[:2]
        encoded = self._encoder.encode(prepared.pixels)
        message = FrameMessage(
            camera=self.spec.camera,
            seq=self.seq,
            pts=decoded.pts,
            width=geometry.width,
            height=geometry.height,
            scale=geometry.scale,
            pad_x=geometry.pad_x,
            pad_y=geometry.pad_y,
            captured=captured,
            enqueued=self._clock(),
            pixels=encoded.pixels,
            input_width=width,
            input_height=height,
            encoding=encoded.encoding,
            shm=encoded.shm,
            session=self.session,
            redis_down=self.redis_down,
        )
        # A camera that sheds is capped here. Exact, not "~": an approximate cap trims whole
        # 100-entry nodes, so the stream could hold ~100 frames more than the backlog bound
        # (120 MB of raw pixels, or shm references to slots already overwritten). A file job
        # is not: it waits for room instead, and an XADD the client retried after a lost reply
        # (a Redis restart) adds a second copy its room count does not know of, which a cap
        # would pay for by trimming an unread frame.
        maxlen = self.spec.max_backlog if self._sheds else None
        try:
            if self._fence is not None:
                progress = self._progress(frames=self.seq + 1)
                self._fence.frame(self._frames_redis, message.to_fields(), progress, maxlen)
            else:
                pipe = self._frames_redis.pipeline(transaction=False)
                pipe.xadd(self._stream_key, message.to_fields(), maxlen=maxlen, approximate=False)
                self._record_progress(pipe, frames=self.seq + 1)
                pipe.execute()
        except OUTAGE_ERRORS:
            if not self._sheds:
                raise  # a file job waited reconnect_timeout_s for Redis already
            self._redis_failed()
            return True
        self._redis_backoff_s = REDIS_RETRY_MIN_S
        self.seq += 1
        return True

    def _progress(self, *, frames: int) -> dict[str, str | int]:
        return {"session": self.session, "frames": frames, "redis_down": self.redis_down}

    def _record_progress(self, pipe: redis.client.Pipeline, *, frames: int) -> None:
        """The session's frame count so far, beside its frames (same round trip): the
        supervisor ends the session with it if this process dies."""
        pipe.hset(self._keys.progress(self.spec.camera), mapping=self._progress(frames=frames))

    def _redis_failed(self) -> None:
        """Redis did not answer a camera that sheds: this frame is shed, and the next ones
        until a retry, later and later while it stays away."""
        self._redis_retry_at = self._clock() + self._redis_backoff_s
        self._redis_backoff_s = min(2 * self._redis_backoff_s, REDIS_RETRY_MAX_S)
        self._shed_for_redis()

    def _behind(self) -> bool:
        """A camera that sheds (live) whose stream holds its whole backlog: the batcher is
        behind, and this frame would only push an older one out (MAXLEN) after paying for its
        colour conversion, letterbox and trip through Redis.  It is skipped before all that
        instead (the caller leaves its seq as a gap, counted as overflow).

        Room is asked for only when the room seen last is used up (only this worker adds to
        the stream); that round trip also records the session's progress, so a decoder that
        dies after skipping frames still has them counted."""
        if self._room <= 0:
            if self._fence is not None:
                progress = self._progress(frames=self.seq + 1)
                backlog = self._fence.progress(self._frames_redis, progress)
            else:
                pipe = self._frames_redis.pipeline(transaction=False)
                self._record_progress(pipe, frames=self.seq + 1)
                pipe.xlen(self._stream_key)
                _, backlog = pipe.execute()
            self._room = self.spec.max_backlog - backlog
            if self._room <= 0:
                return True
        self._room -= 1
        return False

    def _shed_for_redis(self) -> None:
        """A decoded frame Redis could not take: its seq is used up (a gap the batcher sees)
        and it is counted, so the gap is told apart from overflow."""
        self.seq += 1
        self.redis_down += 1

    def _wait_for_room(self, stop: StopSignal) -> bool:
        """Block while the backlog is full (acknowledged frames are deleted, so XLEN = backlog).

        Only this worker adds to its stream, so room seen once lasts until it is used up:
        XLEN is asked again only then, not for every frame."""
        while self._room <= 0:
            self._room = self.spec.max_backlog - self._redis.xlen(self._stream_key)
            if self._room <= 0 and stop.wait(BACKPRESSURE_POLL_S):
                return False
        self._room -= 1
        return True


def wait_until_read(
    client: redis.Redis,
    stream_key: str,
    released: StopSignal | None,
    idle_s: float = LINGER_IDLE_S,
    gone: StopSignal | None = None,
) -> None:
    """Block while the batcher still has this camera's frames to read (the stream is not empty:
    acknowledged frames are deleted), until ``released``. Without a ``released`` signal (no
    supervising daemon), also until nothing was read for ``idle_s`` (no batcher is reading);
    with one, only the daemon decides: a slow model load must not cost the frames.  ``gone``:
    the daemon is gone, nobody will read them."""
    if released is None:
        released = threading.Event()
    else:
        idle_s = math.inf
    last, idle_since = None, time.monotonic()
    gone = gone or threading.Event()
    while (backlog := client.xlen(stream_key)) > 0 and not (released.is_set() or gone.is_set()):
        now = time.monotonic()
        if backlog != last:
            last, idle_since = backlog, now
        elif now - idle_since >= idle_s:
            return
        released.wait(LINGER_POLL_S)
