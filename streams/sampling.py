"""Which decoded frames enter the pipeline: every ``vid_stride``-th, and at most ``max_fps`` a
second of stream time (DeepStream's drop-frame-interval, Ultralytics' ``vid_stride``,
Frigate's ``detect.fps``).

Frames not taken are never converted, letterboxed or sent, and get no ``seq``: they are counted
as ``sampled_out``, apart from the frames the pipeline decoded and processed or dropped.  Most
are still decoded (the codec needs a frame to decode the next), except where key frames alone
give what ``max_fps`` asks for: then the others are never decoded (:class:`KeyframeGate`).
"""

from __future__ import annotations

from typing import Literal

TOLERANCE_S = 1e-3  # timestamps are rounded to the stream's time base

#: ``all``: decode every frame; ``keyframes``: decode key frames only; ``auto``: key frames only
#: once ``max_fps`` takes fewer frames than the stream's measured key-frame interval gives.
DecodeFrames = Literal["auto", "all", "keyframes"]


class FrameSampler:
    """Decides frame by frame; one per decoder session."""

    def __init__(self, *, vid_stride: int = 1, max_fps: float | None = None):
        if vid_stride < 1 or (max_fps is not None and max_fps <= 0):
            raise ValueError("vid_stride must be >= 1 and max_fps > 0")
        self.vid_stride = vid_stride
        self._period = 1.0 / max_fps if max_fps else 0.0
        self._index = 0
        self._next_at: float | None = None  # stream time from which the next frame is taken

    def take(self, at: float) -> bool:
        """Whether the next decoded frame, at stream time ``at`` (seconds), is taken."""
        index, self._index = self._index, self._index + 1
        if index % self.vid_stride:
            return False
        if not self._period:
            return True
        due, period = self._next_at, self._period
        if due is not None and at < due - TOLERANCE_S and at >= due - 2 * period:
            return False  # too soon after the last one taken
        # taken: on the grid while the stream keeps time; a gap, a loop or a clock that went
        # back starts the grid again here
        on_grid = due is not None and due - TOLERANCE_S <= at < due + period
        self._next_at = due + period if on_grid else at + period
        return True


class KeyframeGate:
    """Which packets a camera's decoder skips without decoding (one per decoder session).

    Where ``max_fps`` asks for a frame every P seconds and the stream sends a key frame at
    least every P seconds (its GOP, measured between the last key frames), decoding the frames
    between key frames only to throw them away is the cost of a camera sampled at 1 fps: the
    decoder then decodes key frames alone (DeepStream's ``skip-frames=2``, an NVR's "key
    frames only" for its AI).  The sampler still spaces what it takes by ``max_fps``, among the
    key frames: each frame taken is the first key frame at or after its due time, so it comes at
    most one GOP late, and never closer to the one before than ``1 / max_fps``.  A packet
    skipped is a frame never decoded: counted ``sampled_out`` from the packet, so decoded +
    skipped = packets.  ``vid_stride`` counts frames, which key frames
    alone would change the meaning of: with it set, every frame is decoded."""

    def __init__(
        self, mode: DecodeFrames = "auto", *, max_fps: float | None = None, vid_stride: int = 1
    ):
        self.mode = mode
        self._period = 1.0 / max_fps if max_fps and vid_stride == 1 else None
        self._last_key: float | None = None
        self.gop_s: float | None = None  # time between the last two key frames

    @property
    def keyframes_only(self) -> bool:
        if self.mode != "auto":
            return self.mode == "keyframes"
        return (
            self._period is not None
            and self.gop_s is not None
            and self.gop_s <= self._period + TOLERANCE_S
        )

    def skip(self, *, key: bool, at: float | None) -> bool:
        """Whether the packet (a key frame's or not, at stream time ``at``) is left undecoded."""
        if key:
            if at is not None and self._last_key is not None and at > self._last_key:
                self.gop_s = at - self._last_key
            self._last_key = at if at is not None else self._last_key
            return False
        return self.keyframes_only
