"""Which decoded frames enter the pipeline: every ``vid_stride``-th, and at most ``max_fps`` a
second of stream time (DeepStream's drop-frame-interval, Ultralytics' ``vid_stride``,
Frigate's ``detect.fps``).

Frames not taken are decoded (the codec needs every frame to decode the next) but never
converted, letterboxed or sent, and get no ``seq``: they are counted as ``sampled_out``, apart
from the frames the pipeline decoded and processed or dropped.
"""

from __future__ import annotations

TOLERANCE_S = 1e-3  # timestamps are rounded to the stream's time base


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
