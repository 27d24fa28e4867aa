"""Fixtures of the component tests (real redis-server, in-process workers)."""

from __future__ import annotations

import pytest

from streams.keys import FRAMES_GROUP, StreamKeys


@pytest.fixture
def gate_pending(redis_client, prefix):
    """Two frames of camera ``gate`` read by worker w1, not yet acknowledged."""
    keys = StreamKeys(prefix)
    frames = keys.frames("gate")
    redis_client.xgroup_create(frames, FRAMES_GROUP, id="0", mkstream=True)
    ids = [redis_client.xadd(frames, {"seq": str(n)}) for n in range(2)]
    redis_client.xreadgroup(FRAMES_GROUP, "w1", {frames: ">"})
    return keys, frames, ids
