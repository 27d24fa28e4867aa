"""What the telemetry exporters cost a frame: ``python -m framebatch_tools.bench.telemetry``.

Feeds the events one frame raises (received, published, its stage times and pixels; one batch
event in eight) through :class:`GuardedTelemetry` with no exporter, then with the Prometheus
exporter and the live view, alternating; prints the median microseconds per frame.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from prometheus_client import CollectorRegistry

from detectors.postprocess import ImageDetections
from detectors.preprocess import LetterboxGeometry
from pipeline.serve.live_view import LiveFrames
from pipeline.serve.metrics import PrometheusTelemetry
from pipeline.telemetry import DetectedFrame, GuardedTelemetry, Telemetry
from streams.messages import Timestamps

FRAMES, ROUNDS, BATCH = 20_000, 5, 8


def seconds_per_frame(telemetry: Telemetry, frame: DetectedFrame, stamps: Timestamps) -> float:
    started = time.perf_counter()
    for index in range(FRAMES):
        telemetry.frames_received("cam", 1)
        telemetry.frames_published("cam", 0.1, 0.01)
        telemetry.frame_detected("cam", stamps, frame)
        if index % BATCH == 0:
            telemetry.batch_inferred(BATCH, 0.2)
    return (time.perf_counter() - started) / FRAMES


def main() -> None:
    metrics = PrometheusTelemetry(CollectorRegistry())
    metrics.configure(max_batch_size=BATCH, instances=2)
    exported = GuardedTelemetry(metrics, LiveFrames())
    bare = GuardedTelemetry()
    boxes = ImageDetections(np.zeros((3, 4), np.float32), np.ones(3, np.float32), np.zeros(3))
    geometry = LetterboxGeometry(960, 540, 2 / 3, 0, 12)
    frame = DetectedFrame(0, np.zeros((384, 640, 3), np.uint8), geometry, boxes)
    stamps = Timestamps(captured=1.0, enqueued=1.01, batched=1.05, inferred=1.10, published=1.12)
    rounds = [
        (seconds_per_frame(bare, frame, stamps), seconds_per_frame(exported, frame, stamps))
        for _ in range(ROUNDS)
    ]
    none = statistics.median(r[0] for r in rounds) * 1e6
    both = statistics.median(r[1] for r in rounds) * 1e6
    print(f"per frame: no exporter {none:.1f} µs, Prometheus + live view {both:.1f} µs")


if __name__ == "__main__":
    main()
