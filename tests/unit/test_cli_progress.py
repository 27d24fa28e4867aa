"""The progress bars fit the terminal: a line wider than it would wrap, and the next redraw
(which moves up one line per camera) would leave the wrapped halves behind."""

from __future__ import annotations

import io
import os

from pipeline.cli.progress import DEFAULT_COLUMNS, ProgressBars, render, terminal_columns
from pipeline.ledger.accounting import Accounting
from pipeline.serve.control import CameraStates

LONG_ID = "loading-dock-north-entrance-camera-7"


def views():
    states = CameraStates()
    states.add(LONG_ID, "/a.mp4", priority=0, live=False)
    states.add("b", "/b.mp4", priority=0, live=False)
    accounting = Accounting([LONG_ID, "b"])
    for seq in range(4):
        accounting.on_received(LONG_ID, seq)
    accounting.on_published([(LONG_ID, 0.1, 0.0)] * 4, 1.0)
    return states.views({c.camera: c for c in accounting.summary().cameras})


def test_lines_are_cut_to_the_terminal_width():
    wide = render(views(), {LONG_ID: 10, "b": 10})
    assert max(len(line) for line in wide) > 60  # the case: it would wrap at 60 columns
    narrow = render(views(), {LONG_ID: 10, "b": 10}, columns=60)
    assert all(len(line) <= 59 for line in narrow)
    assert [line[:59] for line in wide] == narrow


def test_the_bars_are_drawn_at_the_width_the_terminal_has_now():
    stream = io.StringIO()
    widths = iter([60, 40])
    bars = ProgressBars(stream, views, {LONG_ID: 10, "b": 10}, columns=lambda _s: next(widths))
    bars._draw()
    bars._draw()
    first, second = stream.getvalue().split("\x1b[2F")  # up two lines: redrawn in place
    assert all(len(line) <= 59 + len("\x1b[2K") for line in first.splitlines())
    assert all(len(line) <= 39 + len("\x1b[2K") for line in second.splitlines())
    assert f"\x1b[2K{LONG_ID} [" in first


def test_a_terminal_that_tells_no_width_counts_as_80_columns():
    controller, terminal = os.openpty()  # a pty nobody sized: 0 columns
    try:
        with os.fdopen(terminal, "w") as stream:
            assert terminal_columns(stream) == DEFAULT_COLUMNS
        assert terminal_columns(io.StringIO()) == DEFAULT_COLUMNS  # no file descriptor
    finally:
        os.close(controller)
