"""A decode process logs in the daemon's format: it is spawned, so it inherits no logging set-up,
and its lines ("Redis unreachable ... retrying", "decoder stopped") came out bare, without the
time and level every other line has."""

from __future__ import annotations

import logging
import multiprocessing
import re

import pytest

from detectors.preprocess import Letterbox
from streams.decode_process import DecoderJob, ProcessSettings, run_decoder_process
from streams.decode_worker import DecoderSpec, ProcessFlag
from streams.embedded_redis import free_tcp_port

pytestmark = pytest.mark.integration

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \S")


def test_a_decode_process_logs_with_time_and_level(tmp_path, capfd):
    """A real spawned decode process, given a camera whose Redis is not there: the camera's
    thread retries for a second, then stops and says so over the pipe; the process goes on
    until told to stop. Every line it wrote (stderr, inherited from this process) is
    stamped."""
    spec = DecoderSpec(
        camera="cam",
        url=str(tmp_path / "missing.mp4"),  # fails at once: the decoder only talks to Redis
        live=False,
        realtime=False,
        loop=False,
        backpressure=True,
        max_backlog=4,
    )
    job = DecoderJob(
        spec=spec,
        redis_url=f"redis://127.0.0.1:{free_tcp_port()}/0",  # nothing listens there
        prefix="logging",
        prepare=Letterbox(64, 64),
        reconnect_timeout_s=1.0,
    )
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    stop = ProcessFlag()
    process = context.Process(
        target=run_decoder_process,
        args=(ProcessSettings(log_level=logging.INFO), stop, None, theirs),
    )
    process.start()
    ours.send(("start", job))
    assert ours.poll(60)
    assert ours.recv() == ("exited", "cam", 1, "Redis unreachable")
    assert process.is_alive()  # the other cameras would go on
    stop.set()
    process.join(60)
    assert process.exitcode == 0
    lines = capfd.readouterr().err.splitlines()
    assert any("Redis unreachable" in line and "retrying" in line for line in lines), lines
    assert any("decoder stopped" in line for line in lines), lines
    unstamped = [line for line in lines if not STAMPED.match(line)]
    assert not unstamped, unstamped
