"""``framebatch run --until-done`` on a terminal: one progress bar per camera, redrawn in place.

A camera's frames are done once processed or dropped with a cause; its total is the clip's frame
count from the container (divided by ``vid_stride``), known once it ends if the container does
not say (or ``max_fps`` thins it): the bar then shows the count alone.

Drawn here rather than with rich or tqdm: the bars need a line per camera redrawn from a
thread, log lines above them and plain output on a pipe, which is these few lines; rich would
add four packages to the core install (a daemon's, in containers) for one mode on a terminal,
and tqdm's positioned bars leave stray lines when other output interleaves (tqdm#532, #1434).
Lines are cut to the terminal's width, so a narrow terminal never wraps them out of place.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import TextIO

import av

from pipeline.config import CameraConfig
from pipeline.serve.control import CameraView

REDRAW_S = 0.5
BAR_WIDTH = 30
DEFAULT_COLUMNS = 80


def expected_frames(camera: CameraConfig) -> int | None:
    """Frames the camera will hand to the batcher, from the container; None when unknown."""
    if camera.is_live or camera.max_fps is not None:
        return None
    try:
        with av.open(camera.url) as container:
            stream = container.streams.video[0]
            frames = stream.frames
            if not frames and stream.duration and stream.average_rate:
                frames = int(float(stream.duration * stream.time_base * stream.average_rate))
    except (av.FFmpegError, IndexError, OSError):
        return None
    return math.ceil(frames / camera.vid_stride) if frames else None


def render(
    views: Sequence[CameraView], totals: dict[str, int | None], columns: int | None = None
) -> list[str]:
    """A line per camera; with ``columns`` (the terminal's width) each fits in it, or a long
    line would wrap and the bars would no longer be redrawn in place."""
    width = max((len(v.id) for v in views), default=0)
    lines = []
    for view in views:
        done = view.processed + sum(view.dropped.values())
        ended = view.state in ("ended", "failed", "removed")  # its decoder's count is final
        total = view.decoded if ended else totals.get(view.id)
        if total:
            share = min(1.0, done / total)
            bar = "#" * int(share * BAR_WIDTH)
            line = f"{view.id:<{width}} [{bar:<{BAR_WIDTH}}] {done}/{total} {share:4.0%}"
        else:
            line = f"{view.id:<{width}} {done} frames"
        lines.append(f"{line}  {view.fps:5.1f} fps  {view.state}")
    if columns is not None:  # the last column left empty: a full line may wrap at once
        lines = [line[: max(1, columns - 1)] for line in lines]
    return lines


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` writes to, now (it may be resized); 80 when it
    says nothing (a pty that was never sized)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):  # no file descriptor, closed, not a tty
        columns = 0
    return columns if columns > 0 else DEFAULT_COLUMNS


class ProgressBars:
    """Redraws the bars on ``stream`` (a terminal) from a thread until ``close``."""

    def __init__(
        self,
        stream: TextIO,
        views: Callable[[], Sequence[CameraView] | None],
        totals: dict[str, int | None],
        columns: Callable[[TextIO], int] = terminal_columns,
    ):
        self._stream = stream
        self._columns = columns
        self._views = views
        self._totals = totals
        self._drawn = 0
        self._lock = threading.Lock()  # bars and log lines share the terminal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fb-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._draw()  # the final state stays on screen

    def _run(self) -> None:
        while not self._stop.wait(REDRAW_S):
            self._draw()

    def _draw(self) -> None:
        views = self._views()
        if not views:
            return
        lines = render(views, self._totals, self._columns(self._stream))
        with self._lock:
            up = f"\x1b[{self._drawn}F" if self._drawn else ""  # back to the first bar's line
            self._stream.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
            self._stream.flush()
            self._drawn = len(lines)

    def log_handler(self, inner: logging.Handler) -> logging.Handler:
        """``inner`` writing above the bars: they are erased first and redrawn below."""
        bars = self

        class AboveBars(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                with bars._lock:
                    if bars._drawn:
                        bars._stream.write(f"\x1b[{bars._drawn}F\x1b[J")
                        bars._drawn = 0
                    inner.handle(record)  # its filters and its lock

        handler = AboveBars(inner.level)
        handler.setFormatter(inner.formatter)
        return handler
