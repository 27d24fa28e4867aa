"""Which decoded frames enter the pipeline: every ``vid_stride``-th, and at most ``max_fps`` a
second of stream time (DeepStream's drop-frame-interval, Ultralytics' ``vid_stride``,
Frigate's ``detect.fps``).

Frames not taken are never converted, letterboxed or sent, and get no ``seq``: they are counted
as ``sampled_out``, apart from the frames the pipeline decoded and processed or dropped.  A
frame not taken is still decoded where a frame taken needs it (the codec decodes a frame from
the ones before it); the others are never decoded (:class:`DecodeGate`).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import Literal

TOLERANCE_S = 1e-3  # timestamps are rounded to the stream's time base
GOPS_KEPT = 4  # key-frame intervals the gate remembers: it expects the longest of them
KEYS_IN_FLIGHT = 8  # key frames decoded that a decoder may still hold (frame threading)

#: ``all``: decode every frame; ``keyframes``: key frames only; ``needed``: only what the frames
#: ``max_fps`` takes need (the same frames as ``all``); ``auto``: key frames only once they give
#: what ``max_fps`` asks for (the stream's measured key-frame interval), ``needed`` until then.
DecodeFrames = Literal["auto", "all", "keyframes", "needed"]


class FrameSampler:
    """Decides frame by frame; one per decoder session."""

    def __init__(self, *, vid_stride: int = 1, max_fps: float | None = None):
        if vid_stride < 1 or (max_fps is not None and max_fps <= 0):
            raise ValueError("vid_stride must be >= 1 and max_fps > 0")
        self.vid_stride = vid_stride
        self._period = 1.0 / max_fps if max_fps else 0.0
        self._index = 0
        self._next_at: float | None = None  # stream time from which the next frame is taken
        self.last_at: float | None = None  # the last frame's stream time, taken or not

    def too_soon(self, at: float) -> bool:
        """Whether a frame at stream time ``at`` comes before the next one due, so that
        :meth:`take` would leave it (a stream time far before the grid restarts it instead)."""
        due = self._next_at
        return due is not None and due - 2 * self._period <= at < due - TOLERANCE_S

    def due_at(self) -> float | None:
        """Stream time from which the next frame is taken; None before the first (or with
        no ``max_fps``, when every frame is due)."""
        return self._next_at if self._period else None

    def take(self, at: float) -> bool:
        """Whether the next decoded frame, at stream time ``at`` (seconds), is taken."""
        index, self._index = self._index, self._index + 1
        self.last_at = at
        if index % self.vid_stride:
            return False
        if not self._period:
            return True
        due, period = self._next_at, self._period
        if self.too_soon(at):
            return False  # too soon after the last one taken
        # taken: on the grid while the stream keeps time; a gap, a loop or a clock that went
        # back starts the grid again here
        on_grid = due is not None and due - TOLERANCE_S <= at < due + period
        self._next_at = due + period if on_grid else at + period
        return True


class DecodeGate:
    """Which packets a camera's decoder skips without decoding (one per decoder session).

    A camera sampled at ``max_fps`` uses one frame every P seconds; decoding the others only to
    throw them away is most of its cost.  Packets come in decode order, each known, before it is
    decoded, by whether it is a key frame, its stream time and (read from its NAL headers,
    :mod:`streams.bitstream`) whether any other frame refers to it:

    * ``keyframes`` decodes key frames alone (DeepStream's ``skip-frames=2``, an NVR's "key
      frames only" for its AI); the sampler still spaces what it takes by ``max_fps`` among
      them, so each frame taken is the first key frame at or after its due time: at most one
      GOP late, never closer to the one before than ``1 / max_fps``; a key frame before the
      next frame due is skipped too.
    * ``needed`` decodes what the frames the sampler will take need, and takes the very frames a
      full decode takes: a non-reference frame before the next due time is skipped (nothing
      refers to it, and it comes too soon to be taken), and once the next frame due lies at or
      after the next key frame (the last key frame plus the longest of the last GOPs), the
      rest of the GOP is skipped, references included, up to that key frame.  A GOP cut short
      by a key frame loses nothing; one longer than all the last few makes its frame due come
      with the next key frame (late by the difference).
    * ``auto`` is ``keyframes`` once the measured GOP fits in ``1 / max_fps`` (key frames alone
      give what is asked for), ``needed`` otherwise; without ``max_fps``, ``all``.

    A packet skipped is a frame never decoded: counted ``sampled_out`` from the packet, so
    decoded + skipped = packets.  ``vid_stride`` counts decoded frames, which skipping would
    change the meaning of: with it set, every frame is decoded.  The gate sees the sampler's
    due time as the decoder's output left it, a few frames behind the packets (reordering,
    frame threading): it decodes a few frames more than needed, never fewer."""

    def __init__(
        self,
        mode: DecodeFrames = "auto",
        *,
        max_fps: float | None = None,
        vid_stride: int = 1,
        sampler: FrameSampler | None = None,
    ):
        """``sampler``: the one taking this stream's frames (``needed`` asks it what is due)."""
        self.mode = mode
        self._period = 1.0 / max_fps if max_fps and vid_stride == 1 else None
        self._sampler = sampler
        self._last_key: float | None = None
        self._gops: deque[float] = deque(maxlen=GOPS_KEPT)  # between the last key frames
        self._skipping_to_key = False  # a reference was skipped: nothing decodes before a key
        self._tail_skipped = False  # ...before the last key: its leading pictures cannot decode
        self._keys_in_flight: deque[float] = deque(maxlen=KEYS_IN_FLIGHT)  # key frames decoded

    @property
    def gop_s(self) -> float | None:
        """The longest of the last GOPs: a key frame that comes early (a scene cut, a loop's
        seam) does not make the gate expect the next one early."""
        return max(self._gops, default=None)

    @property
    def keyframes_only(self) -> bool:
        if self.mode != "auto":
            return self.mode == "keyframes"
        return (
            self._period is not None
            and self.gop_s is not None
            and self.gop_s <= self._period + TOLERANCE_S
        )

    def skip(
        self, *, key: bool, at: float | None, reference: Callable[[], bool | None] | None = None
    ) -> bool:
        """Whether the packet (a key frame's or not, at stream time ``at``) is left undecoded.
        ``reference``: reads whether the packet is a reference picture (None: not known)."""
        if key:
            # the GOP before was cut short (or decoded as key frames only): its leading
            # pictures, which refer to it, cannot be decoded
            self._tail_skipped = self._skipping_to_key or self.keyframes_only
            if at is not None and self._last_key is not None and at > self._last_key:
                self._gops.append(at - self._last_key)
            self._last_key = at if at is not None else self._last_key
            self._skipping_to_key = False
            if not self.keyframes_only or at is None:
                return False
            if self._key_unused(at):
                self._skipping_to_key = True  # should key frames stop being enough: its GOP
                return True
            self._keys_in_flight.append(at)
            return False
        if self.keyframes_only:
            return True
        if self.mode == "all" or self._period is None or self._sampler is None or at is None:
            return False
        if self._skipping_to_key or self._leading(at):
            return True
        if self._rest_of_gop_unused(at):
            self._skipping_to_key = True
            return True
        # a frame nothing refers to, too soon to be taken
        return self._sampler.too_soon(at) and reference is not None and reference() is False

    def _key_unused(self, at: float) -> bool:
        """Key frames only, and this one comes before the next frame due: it is not taken,
        and nothing decoded refers to it (a camera sending a key frame every second, sampled
        every two, decodes one key frame in two)."""
        return self._sampler is not None and self._planned(self._sampler).too_soon(at)

    def _planned(self, sampler: FrameSampler) -> FrameSampler:
        """The sampler as it will be once the key frames decoded and not given back yet (a
        decoder holds a frame or more) have reached it: without them its due time lags a key
        frame behind, and no key frame would ever be found unused.  Frames in flight that are
        left out (the non-key frames of a GOP decoded before key frames were enough) make the
        due time earlier, so more is decoded; only one of them restarting the sampler's grid
        (a loop, a gap in time) could move it later."""
        plan = copy.copy(sampler)
        for at in self._keys_in_flight:
            if sampler.last_at is None or at > sampler.last_at:
                plan.take(at)
        return plan

    def _leading(self, at: float) -> bool:
        """A frame before the last key frame in time but after it in decode order (an open
        GOP's leading picture) that refers to the GOP before it, whose tail was skipped."""
        return (
            self._tail_skipped and self._last_key is not None and at < self._last_key - TOLERANCE_S
        )

    def _rest_of_gop_unused(self, at: float) -> bool:
        """The next frame due comes at or after the next key frame: nothing before that key
        frame is taken, and nothing after it refers to what comes before it."""
        assert self._sampler is not None
        due = self._sampler.due_at()
        gop_s = self.gop_s
        if due is None or gop_s is None or self._last_key is None:
            return False
        next_key = self._last_key + gop_s
        return self._sampler.too_soon(at) and due >= next_key - TOLERANCE_S
