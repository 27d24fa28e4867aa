"""The live view's frames: the newest detected frame of each camera, drawn on request.

A telemetry exporter: the publisher hands it every published frame; it keeps a reference to
the newest one per camera (no copy, no encoding on the pipeline's threads) and the HTTP server
draws the boxes and encodes a JPEG only when a browser asks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import cv2
import numpy as np

from pipeline.telemetry import DetectedFrame, Telemetry
from streams.messages import Timestamps

JPEG_QUALITY = 80
BOX_COLOUR = (0, 200, 255)  # BGR


class LiveFrames(Telemetry):
    """Newest detected frame per camera (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frames: dict[str, tuple[DetectedFrame, float]] = {}

    def frame_detected(self, camera: str, stamps: Timestamps, frame: DetectedFrame) -> None:
        with self._lock:
            self._frames[camera] = (frame, stamps.published)

    def forget(self, camera: str) -> None:
        with self._lock:
            self._frames.pop(camera, None)

    def latest(self, camera: str) -> tuple[DetectedFrame, float] | None:
        with self._lock:
            return self._frames.get(camera)

    def jpeg(self, camera: str, label: Callable[[int], str] = str) -> bytes | None:
        """The newest frame with its boxes drawn, as JPEG; None before the first."""
        latest = self.latest(camera)
        return None if latest is None else draw(latest[0], label)


def draw(frame: DetectedFrame, label: Callable[[int], str]) -> bytes:
    """Boxes (original-frame pixels) mapped into the letterboxed image and drawn on a copy."""
    image = np.ascontiguousarray(frame.pixels).copy()
    g = frame.geometry
    found = frame.detections
    for box, score, class_id in zip(found.boxes, found.scores, found.class_ids, strict=True):
        x1, y1, x2, y2 = (int(round(v * g.scale)) for v in box)
        x1, x2, y1, y2 = x1 + g.pad_x, x2 + g.pad_x, y1 + g.pad_y, y2 + g.pad_y
        cv2.rectangle(image, (x1, y1), (x2, y2), BOX_COLOUR, 2)
        text = f"{label(int(class_id))} {score:.2f}"
        cv2.putText(image, text, (x1, max(12, y1 - 4)), cv2.FONT_HERSHEY_SIMPLEX, 0.45, BOX_COLOUR)
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return encoded.tobytes()
