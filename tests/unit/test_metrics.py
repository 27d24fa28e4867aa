"""Prometheus metrics from telemetry events and the scrape-time state (pure logic, a real
prometheus_client registry)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from detectors.postprocess import ImageDetections
from detectors.preprocess import LetterboxGeometry
from pipeline.serve.metrics import DetectorUtilization, PrometheusTelemetry, StateCollector
from pipeline.telemetry import DetectedFrame
from streams.messages import Timestamps


class FakeState:
    def __init__(self, backlog):
        self.backlog = backlog

    def camera_states(self):
        return {"a": "running", "b": "reconnecting"}

    def frames_decoded(self):
        return {"a": 12, "b": 3}

    def stream_backlog(self):
        return self.backlog


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def frame() -> DetectedFrame:
    empty = ImageDetections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0))
    geometry = LetterboxGeometry(960, 540, 2 / 3, 0, 12)
    return DetectedFrame(0, np.zeros((384, 640, 3), np.uint8), geometry, empty)


def test_each_event_lands_in_its_series():
    registry = CollectorRegistry()
    metrics = PrometheusTelemetry(registry)
    metrics.configure(max_batch_size=8, instances=1)
    metrics.add_camera("idle")
    metrics.frames_received("a", 3)
    metrics.frames_dropped("a", "stale", 1)
    metrics.frames_published("a", 0.120, 0.010)
    metrics.frames_published("a", 0.080, 0.020)
    metrics.batch_inferred(4, 0.05)
    stamps = Timestamps(captured=1.0, enqueued=1.01, batched=1.05, inferred=1.10, published=1.12)
    metrics.frame_detected("a", stamps, frame())
    metrics.stage_failed("publish", RuntimeError("x"))
    got = samples(registry)
    assert got[("framebatch_frames_received_total", (("camera", "a"),))] == 3
    assert got[("framebatch_frames_received_total", (("camera", "idle"),))] == 0
    assert got[("framebatch_frames_processed_total", (("camera", "a"),))] == 2
    assert got[("framebatch_frames_dropped_total", (("camera", "a"), ("cause", "stale")))] == 1
    assert got[("framebatch_latency_seconds_count", (("camera", "a"),))] == 2
    assert got[("framebatch_latency_seconds_sum", (("camera", "a"),))] == pytest.approx(0.2)
    assert got[("framebatch_latency_seconds_bucket", (("camera", "a"), ("le", "0.1")))] == 1
    assert got[("framebatch_queue_delay_seconds_count", ())] == 2
    assert got[("framebatch_batch_size_bucket", (("le", "3.0"),))] == 0
    assert got[("framebatch_batch_size_bucket", (("le", "4.0"),))] == 1
    assert got[("framebatch_batch_fill_ratio_sum", ())] == 0.5
    assert got[("framebatch_inference_seconds_count", (("batch_size", "4"),))] == 1
    stage = "framebatch_stage_latency_seconds_sum"
    assert got[(stage, (("stage", "inference"),))] == pytest.approx(0.05)
    assert got[(stage, (("stage", "publish"),))] == pytest.approx(0.02)
    assert got[("framebatch_stage_failures_total", (("stage", "publish"),))] == 1
    assert not any(name.endswith("_created") for name, _ in got)


def test_the_state_is_read_at_scrape_time():
    registry = CollectorRegistry()
    utilization = DetectorUtilization()
    state = FakeState({"a": 5, "b": 0})
    registry.register(StateCollector(state, utilization))
    got = samples(registry)
    assert got[("framebatch_camera_up", (("camera", "a"),))] == 1
    assert got[("framebatch_camera_up", (("camera", "b"),))] == 0
    assert got[("framebatch_camera_state", (("camera", "b"), ("state", "reconnecting")))] == 1
    assert got[("framebatch_camera_state", (("camera", "b"), ("state", "running")))] == 0
    assert got[("framebatch_frames_decoded_total", (("camera", "a"),))] == 12
    assert got[("framebatch_stream_backlog", (("camera", "a"),))] == 5
    assert got[("framebatch_redis_up", ())] == 1
    state.backlog = None  # Redis does not answer: no backlog, redis_up 0
    got = samples(registry)
    assert got[("framebatch_redis_up", ())] == 0
    assert not any(name == "framebatch_stream_backlog" for name, _ in got)


def test_utilization_is_the_busy_share_of_the_window_per_instance():
    clock = FakeClock()
    utilization = DetectorUtilization(window_s=10, clock=clock)
    utilization.instances = 2
    clock.now += 10
    utilization.add(4.0)
    utilization.add(6.0)
    assert utilization.ratio() == pytest.approx(0.5)  # 10 s busy of 2 x 10 s
    clock.now += 5  # half the window later: a batch that ended 5 s ago...
    utilization.add(1.0)
    assert utilization.ratio() == pytest.approx((4 + 5 + 1) / 20)  # ...counts its share inside
    clock.now += 11
    assert utilization.ratio() == 0.0
