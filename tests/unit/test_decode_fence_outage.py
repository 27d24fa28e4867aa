"""A Redis Cluster going down under a decoder's fenced write (``SessionFence.frame``): its
WATCH and look run outside the pipeline's riding out, and CLUSTERDOWN from them is said as the
outage it is, so a live camera sheds its frames meanwhile instead of crashing its decoder."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import ClusterDownError, TryAgainError

from streams.fence import DecodeLease, SessionFence
from streams.keys import StreamKeys


class FakeDownClusterPipeline:
    """A transaction pipeline of a cluster that is down: WATCH answers ``error``."""

    def __init__(self, error: Exception):
        self._error = error

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def watch(self, *keys):
        raise self._error


class FakeDownCluster:
    def __init__(self, error: Exception):
        self._error = error

    def register_script(self, script):
        return None

    def pipeline(self, transaction=True):
        return FakeDownClusterPipeline(self._error)


@pytest.mark.parametrize(
    "error", [ClusterDownError("The cluster is down"), TryAgainError("TRYAGAIN")]
)
def test_a_cluster_down_under_watch_is_an_outage(error):
    client = FakeDownCluster(error)
    fence = SessionFence(client, StreamKeys("t"), "cam", DecodeLease("a", 5000), final=False)
    progress = {"session": "s1", "frames": 1, "redis_down": 0}
    with pytest.raises(redis.ConnectionError, match="Redis Cluster unreachable"):
        fence.frame(client, {"seq": 0}, progress, maxlen=8)
