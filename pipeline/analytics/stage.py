"""The publisher's analytics step for one batch worker: each frame's detections through its
camera's :class:`~pipeline.analytics.camera.CameraAnalytics`, and what to write for them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pipeline.analytics.snapshots import FramePicture, SnapshotStore, render
from pipeline.analytics.store import AnalyticsStore, dump_state
from pipeline.config.analytics import AnalyticsConfig, SnapshotConfig
from pipeline.errors import BadInput
from streams.messages import DetectionMessage
from streams.object_events import ObjectEvent

if TYPE_CHECKING:  # supervision and trackers load with the first camera that has analytics
    from pipeline.analytics.camera import CameraAnalytics

log = logging.getLogger(__name__)


def import_meanwhile() -> threading.Thread:
    """Imports what a camera's analytics needs (supervision, the tracker library, scipy: ~1 s
    of a start here) on a thread of its own, to overlap with the model's loading and warm-up;
    imported after them, it delayed the first result of a run that tracks by as much."""
    thread = threading.Thread(target=_import_analytics, name="fb-analytics-import", daemon=True)
    thread.start()
    return thread


def _import_analytics() -> None:
    try:
        import pipeline.analytics.camera  # noqa: F401
    except Exception:  # noqa: BLE001 - raised again, and said, where it is imported for use
        log.debug("analytics not imported ahead", exc_info=True)


class AnalyticsSettings:
    """Each camera's analytics settings, changed live by the camera API (any thread)."""

    def __init__(
        self,
        settings: Iterable[tuple[str, AnalyticsConfig | None]] = (),
        *,
        snapshots: SnapshotStore | None = None,
    ):
        """``snapshots``: where cameras with ``snapshots`` settings keep their JPEGs."""
        self._lock = threading.Lock()
        self._settings = {camera: config for camera, config in settings if config is not None}
        self.snapshots = snapshots

    def get(self, camera: str) -> AnalyticsConfig | None:
        return self._settings.get(camera)  # a dict read is atomic; writers replace entries

    def set(self, camera: str, config: AnalyticsConfig | None) -> None:
        with self._lock:
            if config is None:
                self._settings.pop(camera, None)
            else:
                self._settings[camera] = config

    def cameras(self) -> list[str]:
        with self._lock:
            return list(self._settings)


@dataclass(frozen=True)
class AnalyticsCommit:
    """What a batch leaves of one camera's analytics: its events and its state after them,
    written with the acknowledgement of its frames."""

    events: tuple[ObjectEvent, ...]
    state: bytes


@dataclass(frozen=True)
class AnalysedBatch:
    messages: list[DetectionMessage]  # in the batch's order, with track ids, filtered
    commits: dict[str, AnalyticsCommit] = field(default_factory=dict)
    #: by camera with zones: the tracks in each zone after the batch, by label
    occupancy: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    #: by camera: the settings its frames of the batch were analysed with (the live view
    #: draws these, not what the API was told since)
    settings: dict[str, AnalyticsConfig] = field(default_factory=dict)

    @property
    def events(self) -> list[ObjectEvent]:
        return [event for commit in self.commits.values() for event in commit.events]


class FrameAnalyser:
    """Owned by one publisher thread."""

    def __init__(
        self,
        *,
        settings: AnalyticsSettings,
        store: AnalyticsStore,
        label: Callable[[int], str],
        classes: int,
    ):
        self._settings = settings
        self._store = store
        self._label = label
        self._classes = classes
        self._cameras: dict[str, CameraAnalytics] = {}
        self._configs: dict[str, AnalyticsConfig] = {}
        self._failed: set[str] = set()  # cameras whose regions do not fit their frames
        self._snapshot_failures = 0

    def check(self, camera: str, config: AnalyticsConfig) -> None:
        """Raises :class:`BadInput` for settings this model cannot follow (a class it lacks)."""
        from pipeline.analytics.camera import CameraAnalytics

        CameraAnalytics(camera, config, label=self._label, classes=self._classes)

    def analyse(
        self,
        messages: Sequence[DetectionMessage],
        fresh: Iterable[str] = (),
        pictures: Sequence[FramePicture] | None = None,
    ) -> AnalysedBatch:
        """``fresh``: cameras that came to this worker since their last frame here: their
        state is read from Redis (another worker may have carried it on meanwhile).
        ``pictures``: what the detector saw of each message's frame, for snapshots."""
        for camera in fresh:
            self._cameras.pop(camera, None)
        analysed: list[DetectionMessage] = []
        events: dict[str, list[ObjectEvent]] = {}
        commits: dict[str, AnalyticsCommit] = {}
        for position, message in enumerate(messages):
            camera = message.camera
            analytics = self._camera(camera)
            if analytics is None:
                analysed.append(message)
                continue
            try:
                frame = analytics.analyse(message)
            except BadInput as exc:  # regions outside the camera's frames
                log.error("camera %s: analytics off: %s", camera, exc)
                self._failed.add(camera)
                del self._cameras[camera]
                # its frames before this one were analysed: their events and state stand
                if camera in events:
                    commits[camera] = AnalyticsCommit(
                        tuple(events.pop(camera)), dump_state(analytics.state)
                    )
                analysed.append(message)
                continue
            analysed.append(frame.message)
            frame_events = frame.events
            snapshots = self._configs[camera].snapshots
            if frame_events and snapshots is not None and pictures is not None:
                frame_events = self._snapshot(frame_events, pictures[position], snapshots)
            events.setdefault(camera, []).extend(frame_events)
        for camera, camera_events in events.items():
            commits[camera] = AnalyticsCommit(
                tuple(camera_events), dump_state(self._cameras[camera].state)
            )
        occupancy = {
            camera: self._cameras[camera].occupancy()
            for camera in commits
            if camera in self._cameras and self._configs[camera].zones
        }
        used = {m.camera: self._configs[m.camera] for m in analysed if m.camera in self._configs}
        return AnalysedBatch(analysed, commits, occupancy, used)

    def forget(self, cameras: Iterable[str]) -> None:
        """Drop what is held of these cameras (a batch that was not written, a lease that
        moved on): their next frames here start from the state in Redis."""
        for camera in cameras:
            self._cameras.pop(camera, None)

    def _snapshot(
        self, events: Sequence[ObjectEvent], picture: FramePicture, settings: SnapshotConfig
    ) -> tuple[ObjectEvent, ...]:
        """The events, those of the kinds asked for with their snapshot written.  A snapshot
        that cannot be written (a full disk) leaves its event without one: an event is never
        held back for its picture."""
        store = self._settings.snapshots
        if store is None:
            return tuple(events)
        taken = []
        for event in events:
            if event.kind in settings.kinds:
                try:
                    path = store.write(event.camera, event.id, render(picture, event, settings))
                except Exception as exc:  # a full disk, a box OpenCV cannot draw: no picture
                    self._snapshot_failures += 1
                    if self._snapshot_failures == 1 or self._snapshot_failures % 1000 == 0:
                        log.warning(
                            "camera %s: snapshot not written (%d so far): %s",
                            event.camera,
                            self._snapshot_failures,
                            exc,
                        )
                else:
                    event = replace(event, snapshot=path)
            taken.append(event)
        return tuple(taken)

    def _camera(self, camera: str) -> CameraAnalytics | None:
        config = self._settings.get(camera)
        if config is None:  # analytics off, or the camera removed
            self._cameras.pop(camera, None)
            self._configs.pop(camera, None)
            self._failed.discard(camera)
            return None
        if camera in self._failed and self._configs.get(camera) is config:
            return None
        self._failed.discard(camera)
        current = self._cameras.get(camera)
        if current is not None and self._configs[camera] is config:
            return current
        # new here, or its settings changed: carry the state on (zones kept by name)
        from pipeline.analytics.camera import CameraAnalytics

        state = current.state if current is not None else self._store.load(camera)
        analytics = CameraAnalytics(
            camera, config, label=self._label, classes=self._classes, state=state
        )
        self._cameras[camera] = analytics
        self._configs[camera] = config
        return analytics
