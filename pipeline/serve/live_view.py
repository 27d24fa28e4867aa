"""The live view's frames: the newest detected frame of each camera, drawn on request.

A telemetry exporter: the publisher hands it every published frame; it keeps a reference to
the newest one per camera (no copy, no encoding on the pipeline's threads) and the HTTP server
draws the boxes and encodes a JPEG only when a browser asks.  Where a camera has analytics, the
boxes carry track ids, and its zones and lines are drawn with their running counts (kept here
from the analytics events and occupancy the publisher reports).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np

from detectors.preprocess import LetterboxGeometry
from pipeline.config.analytics import AnalyticsConfig
from pipeline.telemetry import DetectedFrame, Telemetry
from streams.messages import Timestamps
from streams.object_events import ObjectEvent

JPEG_QUALITY = 80
BOX_COLOUR = (0, 200, 255)  # BGR
ZONE_COLOUR = (80, 220, 80)
LINE_COLOUR = (255, 120, 60)
FONT = cv2.FONT_HERSHEY_SIMPLEX


@dataclass
class RegionCounts:
    """A camera's running counts, as its events and occupancy report them."""

    #: (line, direction) -> label -> crossings so far (the events' running ``count``)
    crossings: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)
    #: zone -> label -> tracks in it now
    occupancy: dict[str, dict[str, int]] = field(default_factory=dict)

    def line(self, name: str) -> tuple[int, int]:
        """Crossings in, out (all classes)."""
        total = {d: sum(self.crossings.get((name, d), Counter()).values()) for d in ("in", "out")}
        return total["in"], total["out"]

    def zone(self, name: str) -> int:
        return sum(self.occupancy.get(name, {}).values())


class LiveFrames(Telemetry):
    """Newest detected frame and running counts per camera (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frames: dict[str, tuple[DetectedFrame, float]] = {}
        self._counts: dict[str, RegionCounts] = {}

    def frame_detected(self, camera: str, stamps: Timestamps, frame: DetectedFrame) -> None:
        with self._lock:
            self._frames[camera] = (frame, stamps.published)

    def objects_analysed(self, events: Sequence[ObjectEvent]) -> None:
        with self._lock:
            for event in events:
                if event.kind == "line_cross" and event.count is not None:
                    counts = self._counts.setdefault(event.camera, RegionCounts())
                    line = (event.region, event.direction)
                    by_label = counts.crossings.setdefault(line, Counter())
                    by_label[event.label] = max(by_label[event.label], event.count)

    def zones_occupied(self, camera: str, occupancy: Mapping[str, Mapping[str, int]]) -> None:
        """Every zone of the camera, after a batch: a zone no longer in its settings goes."""
        with self._lock:
            counts = self._counts.setdefault(camera, RegionCounts())
            counts.occupancy = {zone: dict(by_label) for zone, by_label in occupancy.items()}

    def forget(self, camera: str) -> None:
        with self._lock:
            self._frames.pop(camera, None)
            self._counts.pop(camera, None)

    def latest(self, camera: str) -> tuple[DetectedFrame, float] | None:
        with self._lock:
            return self._frames.get(camera)

    def counts(self, camera: str) -> RegionCounts:
        with self._lock:
            counts = self._counts.get(camera, RegionCounts())
            return RegionCounts(
                {key: Counter(c) for key, c in counts.crossings.items()},
                {zone: dict(c) for zone, c in counts.occupancy.items()},
            )

    def jpeg(self, camera: str, label: Callable[[int], str] = str) -> bytes | None:
        """The newest frame with its boxes (and the zones and lines it was analysed with,
        with their counts) drawn, as JPEG; None before the first."""
        latest = self.latest(camera)
        if latest is None:
            return None
        frame = latest[0]
        overlay = None if frame.analytics is None else (frame.analytics, self.counts(camera))
        return draw(frame, label, overlay)


def draw(
    frame: DetectedFrame,
    label: Callable[[int], str],
    overlay: tuple[AnalyticsConfig, RegionCounts] | None = None,
) -> bytes:
    """Boxes (original-frame pixels) mapped into the letterboxed image and drawn on a copy;
    a tracked frame's boxes are named by track id."""
    image = np.ascontiguousarray(frame.pixels).copy()
    g = frame.geometry
    if overlay is not None:
        _draw_regions(image, g, *overlay)
    if frame.published is not None:
        boxes = [
            (d.box, f"{d.label} #{d.track_id}" if d.track_id is not None else d.label)
            for d in frame.published.detections
        ]
    else:
        found = frame.detections
        boxes = [
            (box, f"{label(int(class_id))} {score:.2f}")
            for box, score, class_id in zip(found.boxes, found.scores, found.class_ids, strict=True)
        ]
    for box, text in boxes:
        x1, y1 = _to_image(g, box[0], box[1])
        x2, y2 = _to_image(g, box[2], box[3])
        cv2.rectangle(image, (x1, y1), (x2, y2), BOX_COLOUR, 2)
        cv2.putText(image, text, (x1, max(12, y1 - 4)), FONT, 0.45, BOX_COLOUR)
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return encoded.tobytes()


def _to_image(g: LetterboxGeometry, x: float, y: float) -> tuple[int, int]:
    return int(round(x * g.scale)) + g.pad_x, int(round(y * g.scale)) + g.pad_y


def _draw_regions(
    image: np.ndarray, g: LetterboxGeometry, config: AnalyticsConfig, counts: RegionCounts
) -> None:
    """Zones (outline, name, tracks in it) and lines (an arrow from start to end, crossings
    in and out), as the camera's analytics sees them."""
    # supervision is imported where analytics are used: the GPU check's machine lacks it
    from pipeline.analytics.geometry import FrameGeometry, RegionDoesNotFit

    try:
        regions = FrameGeometry.resolve(config, g.width, g.height, "analytics")
    except RegionDoesNotFit:
        return  # the camera's analytics is off until its settings change (logged there)
    for name, zone in regions.zones.items():
        points = np.array([_to_image(g, x, y) for x, y in zone.polygon], np.int32)
        cv2.polylines(image, [points], isClosed=True, color=ZONE_COLOUR, thickness=2)
        x, y = points.min(axis=0)
        text = f"{name}: {counts.zone(name)}"
        cv2.putText(image, text, (int(x) + 4, int(y) + 16), FONT, 0.5, ZONE_COLOUR, 1)
    for name, (start, end) in regions.lines.items():
        a, b = _to_image(g, *start), _to_image(g, *end)
        cv2.arrowedLine(image, a, b, LINE_COLOUR, 2, tipLength=0.03)
        crossed_in, crossed_out = counts.line(name)
        text = f"{name}: in {crossed_in} out {crossed_out}"
        cv2.putText(image, text, (a[0] + 4, max(14, a[1] - 6)), FONT, 0.5, LINE_COLOUR, 1)
