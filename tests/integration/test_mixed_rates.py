"""Four live-paced cameras at different frame rates, batched together on a real redis-server."""

from __future__ import annotations

import json
import signal
import time

import pytest

from streams.consumer import DetectionConsumer
from streams.keys import StreamKeys
from tests.conftest import MODEL, SAMPLE_CLIPS, VIDEOS
from tests.integration.runner import start_daemon, write_config

pytestmark = pytest.mark.integration

RATES = {"highway": 5.0, "lobby": 3.0, "street": 2.0, "bars": 1.0}  # 11 frames/s in all


def test_cameras_at_different_rates_share_batches_in_order(
    assets, redis_url, redis_client, prefix, tmp_path
):
    clips = {
        "highway": VIDEOS / "highway_traffic_960x540_30fps.mp4",
        "lobby": VIDEOS / "indoor_person_768x432_10fps.mp4",
        "street": VIDEOS / "street_night_1920x1080_3fps.mp4",
        "bars": SAMPLE_CLIPS / "bars_320x240_5fps.mp4",
    }
    config = write_config(
        tmp_path / "mixed.yaml",
        model=MODEL,
        cameras=[
            {"id": cam, "url": str(clip), "realtime": True, "loop": True, "fps": RATES[cam]}
            for cam, clip in clips.items()
        ],
        redis_url=redis_url,
        prefix=prefix,
        max_batch_size=4,
        max_wait_ms=400,
        # a timeout window makes cross-camera batches certain at this low load (adaptive would
        # rightly run most frames alone: tests/unit and the simulator cover its choices)
        batching_extra={"policy": "timeout"},
    )
    summary_path = tmp_path / "summary.json"
    daemon = start_daemon(config, "--summary-json", str(summary_path))
    try:
        consumer = DetectionConsumer(redis_client, StreamKeys(prefix), from_start=True)
        deadline = time.monotonic() + 90
        messages = []
        for message in consumer.messages(timeout_s=60):
            messages.append(message)
            if {m.camera for m in messages} == set(RATES) and len(messages) >= 60:
                break
            if time.monotonic() > deadline:
                break
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, err
    assert {m.camera for m in messages} == set(RATES)
    for cam in RATES:  # each camera's results come out in order
        seqs = [m.seq for m in messages if m.camera == cam]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    cameras_per_batch: dict[int, set[str]] = {}
    for m in messages:
        cameras_per_batch.setdefault(m.batch_id, set()).add(m.camera)
    assert max(len(c) for c in cameras_per_batch.values()) >= 2  # batched across cameras
    # faster cameras contribute more frames: roughly in proportion to their rates
    counts = {cam: sum(m.camera == cam for m in messages) for cam in RATES}
    assert counts["highway"] > counts["bars"]
    summary = json.loads(summary_path.read_text())
    for camera in summary["cameras"]:  # every frame processed or dropped with a cause
        assert camera["processed"] + sum(camera["dropped"].values()) <= camera["decoded"]
        assert camera["decoded"] - camera["processed"] - sum(camera["dropped"].values()) <= 8
    assert "queue delay" in out and "fill" in out
