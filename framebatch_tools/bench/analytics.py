"""``framebatch bench-analytics``: what a camera's analytics costs a frame on this CPU, at 0, 10
and 50 objects in view: filters, ByteTrack, a line and a zone, and the state written with each
frame's acknowledgement (the worst case: a batch holds one frame of the camera).

The objects are synthetic (boxes driving down the picture at their own speeds and lanes,
crossing the line and the zone), so the figure is the analytics' alone, not the detector's."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from pipeline.analytics.camera import CameraAnalytics
from pipeline.analytics.store import dump_state
from pipeline.config.analytics import AnalyticsConfig
from streams.messages import Detection, DetectionMessage, Timestamps

SETTINGS = {
    "tracker": {},
    "lines": {"gate": {"start": [0, 540], "end": [1920, 540]}},
    "zones": {"near": {"polygon": [[0, 600], [1920, 600], [1920, 1080], [0, 1080]]}},
}
FPS = 30.0


def scene(objects: int, frames: int, seed: int = 7) -> list[DetectionMessage]:
    """``objects`` boxes in view in every frame, each driving down its lane; one that leaves
    the picture comes back at the top as a new object."""
    rng = np.random.default_rng(seed)
    lanes = rng.uniform(0, 1800, objects)
    speeds = rng.uniform(4, 12, objects)
    starts = rng.uniform(0, 1000, objects)
    messages = []
    for seq in range(frames):
        ys = (starts + speeds * seq) % 1000
        detections = tuple(
            Detection((x, y, x + 80.0, y + 60.0), 0.8, 2, "car")
            for x, y in zip(lanes, ys, strict=True)
        )
        stamps = Timestamps(seq / FPS, 0, 0, 0, 0)
        messages.append(
            DetectionMessage(
                camera="bench",
                seq=seq,
                pts=seq / FPS,
                width=1920,
                height=1080,
                batch_id=0,
                batch_size=1,
                detections=detections,
                timestamps=stamps,
                session="bench",
            )
        )
    return messages


def measure(objects: int, frames: int, repeats: int) -> dict:
    config = AnalyticsConfig.model_validate(SETTINGS)
    messages = scene(objects, frames)
    analyse_ms, state_ms, events, state_bytes = [], [], 0, 0
    for _ in range(repeats):
        camera = CameraAnalytics("bench", config, label=lambda c: "car", classes=80)
        for message in messages[:30]:  # warm: the tracks exist before the clock starts
            camera.analyse(message)
        started = time.perf_counter()
        for message in messages[30:]:
            events += len(camera.analyse(message).events)
        analysed = time.perf_counter()
        for _message in messages[30:]:
            state_bytes = len(dump_state(camera.state))
        dumped = time.perf_counter()
        count = len(messages) - 30
        analyse_ms.append((analysed - started) * 1000 / count)
        state_ms.append((dumped - analysed) * 1000 / count)
    return {
        "objects": objects,
        "frames": frames - 30,
        "repeats": repeats,
        "analyse_ms_per_frame": statistics.median(analyse_ms),
        "state_ms_per_frame": statistics.median(state_ms),
        "total_ms_per_frame": statistics.median(
            a + s for a, s in zip(analyse_ms, state_ms, strict=True)
        ),
        "state_bytes": state_bytes,
        "events_per_frame": events / repeats / (frames - 30),
    }


def run(*, objects: list[int], frames: int, repeats: int, output: Path | None) -> int:
    results = [measure(count, frames, repeats) for count in objects]
    for r in results:
        print(
            f"{r['objects']:3d} objects: analyse {r['analyse_ms_per_frame']:.3f} ms + state "
            f"{r['state_ms_per_frame']:.3f} ms = {r['total_ms_per_frame']:.3f} ms a frame "
            f"(median of {r['repeats']}), state {r['state_bytes']:,} bytes, "
            f"{r['events_per_frame']:.2f} events a frame"
        )
    if output is not None:
        output.write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0
