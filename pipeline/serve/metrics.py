"""Prometheus metrics of a running pipeline (``/metrics`` on ``http.listen``).

Two sources, one registry per run:

* :class:`PrometheusTelemetry` turns the telemetry events of every detector worker into
  counters and histograms as they happen (frames, drops by cause, batch sizes, latencies,
  inference times, stage failures);
* :class:`StateCollector` asks the pipeline at scrape time for what is a state, not an event:
  camera states, frames decoded (every decoder process's count, as the accounting knows it from
  the frames streams), stream backlogs, Redis reachability, GPU utilisation and memory (NVML).

Names follow Prometheus conventions: base units (seconds, ratios), ``_total`` on counters.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipeline.telemetry import DetectedFrame, Telemetry
from streams.messages import Timestamps
from streams.object_events import ObjectEvent

if TYPE_CHECKING:
    from streams.outputs.relay import OutputStats

log = logging.getLogger(__name__)
disable_created_metrics()  # no *_created series: dashboards and alerts never use them

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
FILL_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
UTILIZATION_WINDOW_S = 10.0
#: the camera states of ``framebatch_camera_state`` (one series each, 1 for the current one)
CAMERA_STATES = (
    "starting",
    "running",
    "reconnecting",
    "restarting",
    "ended",
    "failed",
    "draining",
    "removed",
)
#: stages of a frame's latency: (stage, from stamp, to stamp)
STAGES = (
    ("transport", "captured", "enqueued"),  # decode, convert, letterbox, into the stream
    ("queue", "enqueued", "batched"),  # in the stream and the batching queue
    ("inference", "batched", "inferred"),  # prepare + the detector (+ waiting for it)
    ("publish", "inferred", "published"),  # post-process, sinks, acknowledgement
)


class DetectorUtilization:
    """Share of the last ``window_s`` the detector instances were running batches."""

    def __init__(self, window_s: float = UTILIZATION_WINDOW_S, clock=time.monotonic):
        self._window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._batches: deque[tuple[float, float]] = deque()  # (ended at, seconds)
        self.instances = 1
        self._since = clock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._batches.append((self._clock(), seconds))

    def ratio(self) -> float:
        now = self._clock()
        start = max(now - self._window_s, self._since)
        with self._lock:
            while self._batches and self._batches[0][0] <= now - self._window_s:
                self._batches.popleft()
            # a batch that began before the window counts only for its part inside it
            busy = sum(min(seconds, ended - start) for ended, seconds in self._batches)
        span = now - start
        return min(1.0, busy / (span * self.instances)) if span > 0 else 0.0


class PrometheusTelemetry(Telemetry):
    """The telemetry events as Prometheus counters and histograms (thread-safe, cheap)."""

    def __init__(self, registry: CollectorRegistry):
        self.utilization = DetectorUtilization()
        self._max_batch_size = 1

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: Sequence[str], buckets) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        self._received = counter(
            "framebatch_frames_received", "Frames read from the frames streams", ["camera"]
        )
        self._processed = counter(
            "framebatch_frames_processed", "Frames whose detections are published", ["camera"]
        )
        self._dropped = counter(
            "framebatch_frames_dropped", "Frames without detections, by cause", ["camera", "cause"]
        )
        self._stage_failures = counter(
            "framebatch_stage_failures", "Batch worker stages that died", ["stage"]
        )
        self._batch_size = histogram(
            "framebatch_batch_size", "Frames per inference batch", (), BATCH_SIZE_BUCKETS
        )
        self._fill = histogram(
            "framebatch_batch_fill_ratio", "Batch size over max_batch_size", (), FILL_BUCKETS
        )
        self._inference = histogram(
            "framebatch_inference_seconds",
            "Detector time of one batch, by batch size",
            ["batch_size"],
            LATENCY_BUCKETS,
        )
        self._queue_delay = histogram(
            "framebatch_queue_delay_seconds",
            "From the decoder's XADD to the batch's dispatch",
            (),
            LATENCY_BUCKETS,
        )
        self._latency = histogram(
            "framebatch_latency_seconds",
            "From capture to the detections' publication",
            ["camera"],
            LATENCY_BUCKETS,
        )
        self._stage = histogram(
            "framebatch_stage_latency_seconds",
            "A frame's time in each stage: transport, queue, inference, publish",
            ["stage"],
            LATENCY_BUCKETS,
        )

        # labels bounded by the config: ≤ 32 zones and 32 lines a camera, the model's classes
        self._object_events = counter(
            "framebatch_object_events",
            "Analytics events: tracks started and ended, zone entries and exits, line "
            "crossings (direction in or out), loitering; region is the zone or line",
            ["camera", "kind", "region", "label", "direction"],
        )
        self._occupancy = Gauge(
            "framebatch_zone_occupancy",
            "Tracks in a zone now, by the label they entered with",
            ["camera", "zone", "label"],
            registry=registry,
        )
        self._occupied: dict[tuple[str, str], set[str]] = {}  # labels set, to zero when gone

    def configure(self, *, max_batch_size: int, instances: int) -> None:
        self._max_batch_size = max_batch_size
        self.utilization.instances = max(1, instances)

    def add_camera(self, camera: str) -> None:
        """Series at zero from the start, so rates and alerts see a camera before its first
        frame (and one that never sends any)."""
        self._received.labels(camera)
        self._processed.labels(camera)

    def frames_received(self, camera: str, count: int) -> None:
        self._received.labels(camera).inc(count)

    def frames_dropped(self, camera: str, cause: str, count: int) -> None:
        self._dropped.labels(camera, cause).inc(count)

    def frames_published(self, camera: str, latency_s: float, queue_delay_s: float) -> None:
        self._processed.labels(camera).inc()
        self._latency.labels(camera).observe(latency_s)
        self._queue_delay.observe(queue_delay_s)

    def batch_inferred(self, size: int, seconds: float) -> None:
        self._batch_size.observe(size)
        self._fill.observe(size / self._max_batch_size)
        self._inference.labels(str(size)).observe(seconds)
        self.utilization.add(seconds)

    def frame_detected(self, camera: str, stamps: Timestamps, frame: DetectedFrame) -> None:
        for stage, start, end in STAGES:
            self._stage.labels(stage).observe(
                max(0.0, getattr(stamps, end) - getattr(stamps, start))
            )

    def stage_failed(self, stage: str, error: BaseException) -> None:
        self._stage_failures.labels(stage).inc()

    def objects_analysed(self, events: Sequence[ObjectEvent]) -> None:
        for e in events:
            self._object_events.labels(e.camera, e.kind, e.region, e.label, e.direction).inc()

    def zones_occupied(self, camera: str, occupancy: Mapping[str, Mapping[str, int]]) -> None:
        for zone, by_label in occupancy.items():
            seen = self._occupied.setdefault((camera, zone), set())
            for label in seen - set(by_label):
                self._occupancy.labels(camera, zone, label).set(0)
            for label, count in by_label.items():
                self._occupancy.labels(camera, zone, label).set(count)
            seen.update(by_label)


class PipelineState(Protocol):
    """What the collector asks the running pipeline at each scrape."""

    def camera_states(self) -> Mapping[str, str]: ...

    def frames_decoded(self) -> Mapping[str, int]: ...

    def stream_backlog(self) -> Mapping[str, int] | None:
        """Frames waiting in each camera's stream; None when Redis does not answer."""


class StateCollector(Collector):
    """Gauges read at scrape time: cameras, decoded frames, backlog, Redis, utilisation, GPU."""

    def __init__(
        self,
        state: PipelineState,
        utilization: DetectorUtilization,
        gpus: Sequence[int] = (),
    ):
        self._state = state
        self._utilization = utilization
        self._gpus = NvmlGpus(gpus) if gpus else None

    def collect(self) -> Iterator[Metric]:
        states = self._state.camera_states()
        up = GaugeMetricFamily(
            "framebatch_camera_up",
            "1 while the camera's decoder delivers frames",
            labels=["camera"],
        )
        state = GaugeMetricFamily(
            "framebatch_camera_state",
            "1 for the camera's current state",
            labels=["camera", "state"],
        )
        for camera, current in states.items():
            up.add_metric([camera], float(current == "running"))
            for name in CAMERA_STATES:
                state.add_metric([camera, name], float(current == name))
        yield up
        yield state
        decoded = CounterMetricFamily(
            "framebatch_frames_decoded",
            "Frames the decoder processes decoded (sampled-out frames excluded)",
            labels=["camera"],
        )
        for camera, frames in self._state.frames_decoded().items():
            decoded.add_metric([camera], frames)
        yield decoded
        backlog = self._state.stream_backlog()
        yield GaugeMetricFamily(
            "framebatch_redis_up",
            "1 when Redis answered this scrape",
            value=float(backlog is not None),
        )
        if backlog is not None:
            gauge = GaugeMetricFamily(
                "framebatch_stream_backlog",
                "Frames waiting in the camera's stream",
                labels=["camera"],
            )
            for camera, frames in backlog.items():
                gauge.add_metric([camera], frames)
            yield gauge
        yield GaugeMetricFamily(
            "framebatch_detector_utilization",
            f"Share of the last {UTILIZATION_WINDOW_S:g} s the detector instances ran batches",
            value=self._utilization.ratio(),
        )
        if self._gpus is not None:
            yield from self._gpus.collect()


def nvml_handle(nvml: Any, index: int, visible: str | None = None) -> object:
    """NVML's handle of the GPU this process calls ``cuda:index``.  NVML numbers every GPU of
    the machine in PCI bus order, CUDA only those ``CUDA_VISIBLE_DEVICES`` lets it see: the
    device's UUID is asked of torch where it already runs CUDA, else the index is looked up in
    ``visible`` (``CUDA_VISIBLE_DEVICES``: indices or ``GPU-``/``MIG-`` UUIDs).  Plain indices
    there are NVML's when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (Kubernetes' device plugin sets
    UUIDs)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    if visible is not None:
        entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
        if index >= len(entries):
            raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} has no device {index}")
        entry = entries[index]
        if entry.startswith(("GPU-", "MIG-")):
            return nvml.nvmlDeviceGetHandleByUUID(entry)
        index = int(entry)
    return nvml.nvmlDeviceGetHandleByIndex(index)


class NvmlGpus:
    """GPU utilisation and memory through NVML (``nvidia-ml-py``), when it is installed and
    finds the devices; otherwise nothing, said once.  Each ``cuda:N`` the workers run on is
    found by :func:`nvml_handle`, one by one: a device NVML cannot find is said and left out,
    the others stay.  Written against pynvml's API; it has never run on a GPU here."""

    def __init__(self, indices: Sequence[int], nvml: Any = None, visible: str | None = None):
        """``nvml``, ``visible``: pynvml and ``CUDA_VISIBLE_DEVICES`` (defaults: the real
        ones)."""
        self._handles: list[tuple[str, object]] = []
        self._failed: set[str] = set()
        try:
            if nvml is None:
                import pynvml as nvml

            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no NVML: no GPU metrics, the rest stays
            log.warning("no GPU metrics: NVML unavailable (%s)", exc)
            return
        self._nvml = nvml
        if visible is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        for index in dict.fromkeys(indices):  # each device once, in order
            try:
                self._handles.append((str(index), nvml_handle(nvml, index, visible)))
            except Exception as exc:  # noqa: BLE001 - that GPU only
                log.warning("no GPU metrics for cuda:%d: NVML cannot find it (%s)", index, exc)

    def collect(self) -> Iterator[Metric]:
        if not self._handles:
            return
        utilization = GaugeMetricFamily(
            "framebatch_gpu_utilization_ratio", "GPU busy share (NVML)", labels=["gpu"]
        )
        used = GaugeMetricFamily(
            "framebatch_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "framebatch_gpu_memory_total_bytes", "GPU memory (NVML)", labels=["gpu"]
        )
        for gpu, handle in self._handles:
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # noqa: BLE001 - a MIG slice, a lost GPU: that GPU only
                if gpu not in self._failed:
                    self._failed.add(gpu)
                    log.warning("no NVML figures for GPU %s: %s", gpu, exc)
                continue
            utilization.add_metric([gpu], rates.gpu / 100)
            used.add_metric([gpu], memory.used)
            total.add_metric([gpu], memory.total)
        yield from (utilization, used, total)


class OutputsCollector(Collector):
    """Each output's delivered and dropped events, read at scrape time from the relay (its
    counts are this process's; backlog and pending are the output's group's, whole)."""

    def __init__(self, stats: Callable[[], Mapping[str, OutputStats]]):
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        delivered = CounterMetricFamily(
            "framebatch_output_events_delivered",
            "Analytics events the output's receiver acknowledged (by this process)",
            labels=["output", "kind"],
        )
        dropped = CounterMetricFamily(
            "framebatch_output_events_dropped",
            "Analytics events an output will never deliver, by cause: trimmed (the events "
            "stream's cap removed them while the output was away), rejected (the receiver "
            "refused them), malformed",
            labels=["output", "kind", "cause"],
        )
        backlog = GaugeMetricFamily(
            "framebatch_output_backlog",
            "Analytics events waiting for the output: not read yet, or read and not yet "
            "acknowledged by its receiver",
            labels=["output", "kind"],
        )
        failing = GaugeMetricFamily(
            "framebatch_output_failing",
            "1 while the output's last delivery failed (its receiver is away)",
            labels=["output", "kind"],
        )
        for name, stats in self._stats().items():
            delivered.add_metric([name, stats.kind], stats.delivered)
            for cause, count in stats.dropped.items():
                dropped.add_metric([name, stats.kind, cause], count)
            backlog.add_metric([name, stats.kind], stats.backlog + stats.pending)
            failing.add_metric([name, stats.kind], float(stats.failing))
        yield from (delivered, dropped, backlog, failing)


class DecodePlacementCollector(Collector):
    """A decode worker's view of the decode workers' plan (``framebatch decode``), read at
    scrape time from its last lease tick."""

    def __init__(self, status: Callable[[], Mapping[str, Any]]):
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        unplaced = GaugeMetricFamily(
            "framebatch_decode_unplaced_cameras",
            "Registered cameras no decode worker has room for (decoding.worker_capacity): not "
            "decoded until one has",
        )
        unplaced.add_metric([], len(status["unplaced"]))
        decoding = GaugeMetricFamily(
            "framebatch_decode_cameras", "Cameras the plan gives this decode worker"
        )
        decoding.add_metric([], len(status["decoding"]))
        mine = status["workers"].get(status["worker"], {"load": 0.0, "capacity": None})
        load = GaugeMetricFamily(
            "framebatch_decode_load",
            "The camera weight (decode_weight) the plan gives this decode worker",
        )
        load.add_metric([], mine["load"])
        yield from (unplaced, decoding, load)
        if mine["capacity"] is not None:
            capacity = GaugeMetricFamily(
                "framebatch_decode_capacity", "This decode worker's decoding.worker_capacity"
            )
            capacity.add_metric([], mine["capacity"])
            yield capacity
