"""The consumer API on a real redis-server: cameras that start later are followed too."""

from __future__ import annotations

import threading
import time

import pytest

from streams.consumer import DetectionConsumer
from streams.keys import StreamKeys
from streams.messages import DetectionMessage, Timestamps

pytestmark = pytest.mark.integration


def message(camera: str, seq: int) -> DetectionMessage:
    now = time.time()
    return DetectionMessage(
        camera=camera,
        seq=seq,
        pts=None,
        width=640,
        height=360,
        batch_id=seq,
        batch_size=1,
        detections=(),
        timestamps=Timestamps(now, now, now, now, now),
    )


def test_a_camera_that_starts_while_others_stream_is_discovered(redis_client, prefix):
    keys = StreamKeys(prefix)
    redis_client.xadd(keys.detections("busy"), message("busy", 0).to_fields())
    stop = threading.Event()

    def keep_busy() -> None:  # a camera that never lets a read come back empty
        for seq in range(1, 1500):  # 15 s at most
            if stop.wait(0.01):
                return
            redis_client.xadd(keys.detections("busy"), message("busy", seq).to_fields())

    feeder = threading.Thread(target=keep_busy)
    feeder.start()
    try:
        consumer = DetectionConsumer(redis_client, keys, from_start=True)
        seen: set[str] = set()
        late_added = None
        for got in consumer.messages(timeout_s=5):
            seen.add(got.camera)
            if got.camera == "busy" and got.seq == 5:
                redis_client.xadd(keys.detections("late"), message("late", 0).to_fields())
                late_added = time.monotonic()
            if "late" in seen or (late_added and time.monotonic() - late_added > 4):
                break
    finally:
        stop.set()
        feeder.join()
    assert seen == {"busy", "late"}
