"""Decode worker: one per camera, in its own process; source → letterbox → ``XADD`` frames.

Live cameras keep the freshest frames: the frames stream is capped with ``MAXLEN ~`` and the
batcher counts what the cap trimmed as ``overflow`` drops (by gaps in ``seq``).  File jobs apply
backpressure instead: the worker waits while the camera's backlog is full, so nothing drops.
Every session ends with an :class:`EndOfStream` entry that says how many frames were decoded.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import redis

from streams.events import EventLog
from streams.keys import StreamKeys
from streams.messages import EndOfStream, FrameMessage
from streams.sources import SourceError, VideoSource
from streams.urls import redact_url

BACKPRESSURE_POLL_S = 0.02  # a full backlog lasts seconds; polling faster only burns CPU


class StopSignal(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


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
    open_timeout_s: float = 5.0
    read_timeout_s: float = 5.0
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 10.0


class DecodeWorker:
    """Reads one source and publishes its frames until it ends or ``stop`` is set."""

    def __init__(
        self,
        *,
        spec: DecoderSpec,
        redis_client: redis.Redis,
        keys: StreamKeys,
        prepare: FramePreparer,
        clock: Callable[[], float] = time.time,
    ):
        self.spec = spec
        self._redis = redis_client
        self._keys = keys
        self._stream_key = keys.frames(spec.camera)
        self._prepare = prepare
        self._clock = clock
        self._events = EventLog(redis_client, keys)
        self.seq = 0
        self.decode_errors = 0
        self._room = 0  # frames that may still be added before asking XLEN again

    def run(self, stop: StopSignal) -> EndOfStream:
        """Decode until the source ends (files), ``stop`` is set, or a file fails."""
        spec = self.spec
        backoff = spec.reconnect_initial_s
        reason, error = "stopped", ""
        while not stop.is_set():
            source = VideoSource(
                spec.camera,
                spec.url,
                open_timeout_s=spec.open_timeout_s,
                read_timeout_s=spec.read_timeout_s,
            )
            try:
                with source:
                    self._events.emit(spec.camera, "opened", redact_url(spec.url))
                    backoff, error = spec.reconnect_initial_s, ""
                    self._publish_frames(source, stop)
            except SourceError as exc:
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
        end = EndOfStream(spec.camera, self.seq, reason, error, self.decode_errors)
        self._redis.xadd(self._stream_key, end.to_fields())
        self._events.emit(spec.camera, "ended", f"{reason}: {self.seq} frames")
        return end

    def _publish_frames(self, source: VideoSource, stop: StopSignal) -> None:
        fps = self.spec.fps or source.fps or 30.0
        started, first_seq = self._clock(), self.seq
        for decoded in source.frames():
            if stop.is_set():
                return
            if self.spec.realtime:
                due = started + (self.seq - first_seq) / fps
                delay = due - self._clock()
                if delay > 0 and stop.wait(delay):
                    return
            captured = self._clock()
            prepared = self._prepare(decoded.image)
            if self.spec.backpressure and not self._wait_for_room(stop):
                return
            geometry = prepared.geometry
            height, width = prepared.pixels.shape[:2]
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
                pixels=prepared.pixels.tobytes(),
                input_width=width,
                input_height=height,
            )
            self._redis.xadd(
                self._stream_key,
                message.to_fields(),
                maxlen=self.spec.max_backlog,
                approximate=True,
            )
            self.seq += 1

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


def run_decoder_process(
    spec: DecoderSpec, redis_url: str, prefix: str, prepare: FramePreparer, stop: StopSignal
) -> None:
    """Process entry point: the parent coordinates shutdown, so SIGINT is ignored here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    client = redis.Redis.from_url(redis_url)
    try:
        DecodeWorker(spec=spec, redis_client=client, keys=StreamKeys(prefix), prepare=prepare).run(
            stop
        )
    finally:
        client.close()
