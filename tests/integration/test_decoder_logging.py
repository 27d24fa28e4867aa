"""A decode process logs in the daemon's format: it is spawned, so it inherits no logging set-up,
and its lines ("Redis unreachable ... retrying", "decoder stopped") came out bare, without the
time and level every other line has."""

from __future__ import annotations

import logging
import multiprocessing
import re

import pytest

from detectors.preprocess import Letterbox
from streams.decode_worker import (
    EXIT_REDIS_GONE,
    DecoderJob,
    DecoderSpec,
    ProcessFlag,
    run_decoder_process,
)
from streams.embedded_redis import free_tcp_port

pytestmark = pytest.mark.integration

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \S")


def test_a_decode_process_logs_with_time_and_level(tmp_path, capfd):
    """A real spawned decoder whose Redis is not there: it retries for a second, then stops;
    every line it wrote (stderr, inherited from this process) is stamped."""
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
        log_level=logging.INFO,
    )
    process = multiprocessing.get_context("spawn").Process(
        target=run_decoder_process, args=(job, ProcessFlag())
    )
    process.start()
    process.join(60)
    assert process.exitcode == EXIT_REDIS_GONE
    lines = capfd.readouterr().err.splitlines()
    assert any("Redis unreachable" in line and "retrying" in line for line in lines), lines
    assert any("decoder stopped" in line for line in lines), lines
    unstamped = [line for line in lines if not STAMPED.match(line)]
    assert not unstamped, unstamped
