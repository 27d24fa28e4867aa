"""``framebatch consume`` against a Redis that is not there: bad input at start, one line, exit 2
at once (the long wait, ``--reconnect-timeout``, is for an outage after a good start)."""

from __future__ import annotations

import time

import pytest

from streams.embedded_redis import free_tcp_port
from tests.integration.runner import framebatch

pytestmark = pytest.mark.integration


def test_a_redis_nobody_listens_on_is_exit_2_at_once():
    url = f"redis://127.0.0.1:{free_tcp_port()}/0"
    began = time.monotonic()
    proc = framebatch("consume", "--redis", url, "--reconnect-timeout", "60", timeout=60)
    elapsed = time.monotonic() - began
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"framebatch consume: cannot use Redis at {url}")
    assert "is redis-server running there?" in lines[0]
    assert elapsed < 10, f"{elapsed:.1f} s"  # the process's start included; no 60 s wait
