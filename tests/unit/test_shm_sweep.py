"""The start-up sweep (``pipeline.supervisor.services.open_services``): a new daemon removes
the shm rings of this prefix whose decoder is dead, whoever left them, and says so in one line;
a ring whose pid is alive stays (that pid may have been reused: it is not ours to judge)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams.shm_ring import ShmRing, remove_segments, segment_name

HOST = "test-host/boot-1"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def ring(directory: Path, camera: str, pid: int) -> ShmRing:
    return ShmRing(
        segment_name("t", camera, pid), slots=1, slot_bytes=8, host=HOST, directory=directory
    )


def test_the_sweep_removes_dead_decoders_rings_and_keeps_live_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = [ring(tmp_path, "street", dead_pid()), ring(tmp_path, "door", dead_pid())]
    live = ring(tmp_path, "street", os.getpid())
    with caplog.at_level(logging.INFO, logger="streams.shm_ring"):
        removed = remove_segments("t", host=HOST, directory=tmp_path)  # pids: None, alive or not
    assert sorted(removed) == sorted(r.name for r in dead)
    assert [p.name for p in tmp_path.iterdir()] == [live.name]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("removed 2 shared-memory segment(s)")
    for writer in (*dead, live):
        writer.close()


def test_a_sweep_with_nothing_to_remove_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    live = ring(tmp_path, "street", os.getpid())
    with caplog.at_level(logging.INFO, logger="streams.shm_ring"):
        assert remove_segments("t", host=HOST, directory=tmp_path) == []
    assert caplog.records == [] and live.path.exists()
    live.close()
