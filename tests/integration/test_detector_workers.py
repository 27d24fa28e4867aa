"""Several detector workers (``model.devices``), one per GPU in production, here on the CPU.

The daemon builds one worker per device entry; the detector factory is the only thing swapped
(every worker loads the real model on the CPU), so the sharding, the shared consumer group and
the accounting across workers run for real.
"""

from __future__ import annotations

import pytest

from pipeline.config import parse_config
from pipeline.daemon import Pipeline
from pipeline.supervisor.builders import load_detector, shard_cameras
from streams.keys import StreamKeys
from tests.conftest import MODEL, SAMPLE_CLIPS, VIDEOS
from tests.integration.runner import published

pytestmark = pytest.mark.integration


def test_cameras_are_dealt_round_robin_and_stay_on_one_worker():
    assert shard_cameras(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert shard_cameras(["a"], 3) == [["a"], [], []]


def test_two_workers_process_every_frame_once_in_order(assets, redis_url, redis_client, prefix):
    # worker 0 gets testsrc + hw1080 (80 frames), worker 1 street (8): worker 1 ends first
    clips = {
        "testsrc": SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4",
        "street": VIDEOS / "street_night_1920x1080_3fps.mp4",
        "hw1080": VIDEOS / "highway_traffic_1920x1080_30fps_20frames.mp4",
    }
    config = parse_config(
        {
            "redis": {"url": redis_url, "prefix": prefix},
            "model": {"path": str(MODEL), "threads": 1, "devices": [0, 1]},
            "batching": {"max_batch_size": 4},
            "cameras": [
                {"id": cam, "url": str(clip), "realtime": False} for cam, clip in clips.items()
            ],
        },
        base_dir=".",
    )
    devices_asked = []

    def on_cpu(cfg, device):  # this machine has no GPUs: same model, same code, on the CPU
        devices_asked.append(device)
        return load_detector(cfg, "cpu")

    summary = Pipeline.init_run(config, until_done=True, detector_factory=on_cpu).run()
    assert devices_asked == ["cuda:0", "cuda:1"]
    assert summary.dropped == {}
    # every decoded frame published: a worker that finishes first must not stop the other
    assert all(c.end_reason == "eof" for c in summary.cameras), summary.cameras
    assert all(c.processed == c.decoded > 0 for c in summary.cameras), summary.cameras
    for cam in clips:
        messages = published(redis_client, prefix, cam)
        assert messages and [m.seq for m in messages] == list(range(len(messages))), cam
    groups = redis_client.xinfo_consumers(StreamKeys(prefix).frames("street"), "framebatch-batcher")
    assert [g["name"] for g in groups] == [b"batcher-1"]
    assert summary.processed == sum(len(published(redis_client, prefix, c)) for c in clips)
