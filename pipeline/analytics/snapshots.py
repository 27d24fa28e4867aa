"""Event snapshots: a JPEG of the frame an event happened in, written to a folder before the
event itself is written (so an event never names a file that is not there), kept under a size
and an age cap.

The pixels are the ones the detector saw (the letterboxed model input, padding cut off): a
1920x1080 camera gives 640x360 snapshots at imgsz 640.  That is Frigate's choice too (its
snapshots come from the detect stream): it shows who or what and where, at no decode or copy of
full-resolution frames in the pipeline, but it is no evidence-grade picture, and a crop of a
small object is small (it is not scaled up: that would invent nothing but blur).

A file is named after its event's id, so a frame analysed again (a worker killed before it
acknowledged) writes the same file again, not a second one.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from detectors.preprocess import LetterboxGeometry
from pipeline.config.analytics import SnapshotConfig
from streams.object_events import ObjectEvent

log = logging.getLogger(__name__)

BOX_COLOUR = (0, 200, 255)  # BGR, as the live view's
_SWEEP_EVERY_S = 30.0
_PARTIAL = ".part-"  # a write in progress; one older than this was cut short by a crash
_PARTIAL_STALE_S = 300.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class FramePicture:
    """What the detector saw of a frame: letterboxed pixels (read only) and their geometry."""

    pixels: np.ndarray
    geometry: LetterboxGeometry


def render(picture: FramePicture, event: ObjectEvent, settings: SnapshotConfig) -> bytes:
    """The event's snapshot as JPEG: the frame (padding cut off) or the object's box with a
    margin, its box drawn unless told not to."""
    g = picture.geometry
    content_w = max(1, round(g.width * g.scale))
    content_h = max(1, round(g.height * g.scale))
    image = picture.pixels[g.pad_y : g.pad_y + content_h, g.pad_x : g.pad_x + content_w]
    x1, y1, x2, y2 = (v * g.scale for v in event.box)
    if settings.bounding_box:
        image = np.ascontiguousarray(image).copy()
        corner = (int(round(x1)), int(round(y1)))
        cv2.rectangle(image, corner, (int(round(x2)), int(round(y2))), BOX_COLOUR, 2)
        text = f"{event.label} #{event.track_id}"
        cv2.putText(
            image,
            text,
            (corner[0], max(12, corner[1] - 4)),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.45,
            BOX_COLOUR,
        )
    if settings.crop:
        margin_x, margin_y = (x2 - x1) * settings.margin, (y2 - y1) * settings.margin
        left, top = max(0, int(x1 - margin_x)), max(0, int(y1 - margin_y))
        right = min(image.shape[1], int(np.ceil(x2 + margin_x)))
        bottom = min(image.shape[0], int(np.ceil(y2 + margin_y)))
        if right > left and bottom > top:
            image = image[top:bottom, left:right]
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, settings.quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return encoded.tobytes()


def snapshot_name(event_id: str) -> str:
    """The file name of an event's snapshot (ids hold ``:``; names keep to a safe set)."""
    return _UNSAFE.sub("_", event_id) + ".jpg"


class SnapshotStore:
    """A folder of snapshots, ``<root>/<camera>/<event id>.jpg``, swept to its caps (oldest
    first) every half minute by whichever writer comes by; thread-safe."""

    def __init__(self, root: Path, *, max_bytes: int, max_age_s: float):
        self.root = root
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._swept = time.monotonic()  # the first sweep half a minute after start
        self.removed = 0  # files swept away, since start

    def write(self, camera: str, event_id: str, jpeg: bytes) -> str:
        """Writes the file whole (a temporary file renamed) and returns its path relative to
        the root: what the event carries."""
        folder = self.root / camera
        folder.mkdir(parents=True, exist_ok=True)
        relative = f"{camera}/{snapshot_name(event_id)}"
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=_PARTIAL)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(jpeg)
            os.replace(temporary, self.root / relative)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._sweep_now_and_then()
        return relative

    def read(self, event_id: str) -> bytes | None:
        """The snapshot of the event with this id, if it is (still) here: read whole, so a
        sweep after the look cannot turn it into an error."""
        path = self.path(event_id)
        try:
            return None if path is None else path.read_bytes()
        except FileNotFoundError:
            return None

    def path(self, event_id: str) -> Path | None:
        """The snapshot of the event with this id, if it is (still) here."""
        name = snapshot_name(event_id)
        for folder in self._cameras():
            candidate = folder / name
            if candidate.is_file():
                return candidate
        return None

    def sweep(self, now: float | None = None) -> int:
        """Removes what is past the age cap, then the oldest until under the size cap; returns
        how many files went."""
        now = time.time() if now is None else now
        files = []
        for folder in self._cameras():
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:  # another host's sweep, or the camera's folder removed
                continue
            for entry in entries:
                try:
                    if not entry.is_file():
                        continue
                    stat = entry.stat()
                except FileNotFoundError:  # swept by another process meanwhile
                    continue
                if entry.name.startswith(_PARTIAL):
                    if now - stat.st_mtime > _PARTIAL_STALE_S:
                        Path(entry.path).unlink(missing_ok=True)
                elif entry.name.endswith(".jpg"):
                    files.append((stat.st_mtime, stat.st_size, entry.path))
        files.sort()
        total = sum(size for _, size, _ in files)
        removed = 0
        for mtime, size, path in files:
            if now - mtime <= self._max_age_s and total <= self._max_bytes:
                break
            Path(path).unlink(missing_ok=True)
            total -= size
            removed += 1
        with self._lock:
            self.removed += removed
        return removed

    def _cameras(self) -> list[Path]:
        try:
            return [Path(e.path) for e in os.scandir(self.root) if e.is_dir()]
        except FileNotFoundError:
            return []

    def _sweep_now_and_then(self) -> None:
        """A sweep on a thread of its own every half minute: it stats every file (slow on a
        network folder), which the publisher that wrote the snapshot must not wait for."""
        now = time.monotonic()
        with self._lock:
            if now - self._swept < _SWEEP_EVERY_S:
                return
            self._swept = now
        threading.Thread(target=self._sweep_logged, name="snapshot-sweep", daemon=True).start()

    def _sweep_logged(self) -> None:
        try:
            removed = self.sweep()
        except OSError as exc:  # a full or read-only disk: the next sweep tries again
            log.warning("snapshots: sweeping %s failed: %s", self.root, exc)
            return
        if removed:
            log.info("snapshots: %d past their caps removed from %s", removed, self.root)
