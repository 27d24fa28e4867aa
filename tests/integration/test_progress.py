"""``--until-done`` on a terminal draws a bar per camera; elsewhere (a pipe, CI) it does not."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import MODEL, VIDEOS
from tests.integration.runner import framebatch, write_config

pytestmark = pytest.mark.integration


def test_a_terminal_gets_a_progress_bar_per_camera_and_a_pipe_does_not(assets, tmp_path):
    config = write_config(
        tmp_path / "bars.yaml",
        model=MODEL,
        cameras=[
            {"id": "street", "url": str(VIDEOS / "street_night_1920x1080_3fps.mp4")},
            {"id": "hd", "url": str(VIDEOS / "highway_traffic_1920x1080_30fps_20frames.mp4")},
        ],
        redis_url=None,
    )
    controller, terminal = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "run", str(config), "--until-done"],
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
        )
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end closed: the daemon exited
                break
            if not chunk:
                break
            drawn += chunk
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(controller)
    assert proc.returncode == 0, drawn.decode(errors="replace")[-3000:]
    screen = drawn.decode(errors="replace")
    # the last drawing: each camera's frames all done, out of the clip's count
    assert re.search(r"street +\[#{30}\] 8/8 100%", screen), screen[-2000:]
    assert re.search(r"hd +\[#{30}\] 20/20 100%", screen), screen[-2000:]
    assert "\x1b[2F" in screen  # redrawn in place
    assert "framebatch summary" in out

    piped = framebatch("run", str(config), "--until-done", timeout=120)
    assert piped.returncode == 0 and "\x1b[" not in piped.stderr and "[####" not in piped.stderr
