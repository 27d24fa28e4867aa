"""One camera's analytics: filters and masks → tracker → lines and zones → events, a frame at a
time in the camera's order, with a state that is written to Redis and read back whole."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import supervision as sv

from pipeline.analytics.filters import ObjectFilter, class_ids
from pipeline.analytics.geometry import FrameGeometry, RegionDoesNotFit, anchors
from pipeline.analytics.lines import LineCounter, LineState
from pipeline.analytics.state import CameraState, TrackInfo
from pipeline.analytics.tracking import CameraTracker
from pipeline.analytics.zones import ZoneCounter, ZoneState
from pipeline.config.analytics import AnalyticsConfig
from pipeline.errors import BadInput
from streams.messages import Detection, DetectionMessage
from streams.object_events import EventKind, ObjectEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrameAnalytics:
    """What one frame's analysis gives: its message as published, and its events."""

    message: DetectionMessage
    events: tuple[ObjectEvent, ...]


class CameraAnalytics:
    """Owned by the publisher thread of the worker that holds the camera."""

    def __init__(
        self,
        camera: str,
        config: AnalyticsConfig,
        *,
        label: Callable[[int], str],
        classes: int,
        state: CameraState | None = None,
    ):
        """``label``, ``classes``: the model's class names; a filter naming a class the model
        lacks is bad input (:class:`~pipeline.errors.BadInput`), found here, at start."""
        self.camera = camera
        self._config = config
        self._label = label
        self._where = f"cameras[{camera}].analytics"
        self._filter = ObjectFilter(
            config.filters,
            class_ids(config.filters.classes, label, classes, f"{self._where}.filters.classes"),
        )
        self._zone_classes = {
            name: class_ids(zone.classes, label, classes, f"{self._where}.zones.{name}.classes")
            for name, zone in config.zones.items()
        }
        self._line_classes = {
            name: class_ids(line.classes, label, classes, f"{self._where}.lines.{name}.classes")
            for name, line in config.lines.items()
        }
        self._geometry: FrameGeometry | None = None
        self.state = state or CameraState()
        self._bind_state()

    def _bind_state(self) -> None:
        config, state = self._config, self.state
        self._tracker = None
        if config.tracker is not None:
            self._tracker = CameraTracker(config.tracker, state.tracker)
            state.tracker = self._tracker.state
        # a zone or line the config no longer has is forgotten; a new one starts empty
        state.lines = {name: state.lines.get(name, LineState()) for name in config.lines}
        state.zones = {name: state.zones.get(name, ZoneState()) for name in config.zones}
        self._lines: dict[str, LineCounter] = {}  # made with the frames' geometry
        self._zones = {
            name: ZoneCounter(zone.inertia, zone.loiter_s, state.zones[name])
            for name, zone in config.zones.items()
        }

    def analyse(self, message: DetectionMessage) -> FrameAnalytics:
        """The frame's kept detections with their track ids, and its events.  Raises
        :class:`BadInput` (regions that do not fit the frame) before changing the state."""
        state = self.state
        now = message.pts if message.pts is not None else message.timestamps.captured
        geometry = self._geometry_for(message)
        detections = _as_detections(message.detections)
        kept = self._filter.keep(detections, geometry.masks if geometry else ())
        if kept.all():  # as most frames: no copies
            originals, filtered = message.detections, message
        else:
            detections = detections[kept]
            originals = tuple(d for d, k in zip(message.detections, kept, strict=True) if k)
            filtered = replace(message, detections=originals)
        if message.session == state.session and message.seq <= state.last_seq:
            # analysed already (its state was written with its acknowledgement): cannot happen
            # while frames are acknowledged once; say so rather than count it twice
            log.warning(
                "camera %s: frame %s analysed before; no events", self.camera, message.frame_id
            )
            return FrameAnalytics(filtered, ())
        events = _Events(message, self._label)
        restart = message.session != state.session or (
            state.last_time is not None and now < state.last_time
        )
        settings_changed = self._tracker is not None and self._tracker.settings_changed
        if (restart and state.session) or settings_changed:
            # a new decoder session (its pts are not comparable with the last one's), a stream
            # whose time went back, or new tracker settings: every track ends, its zones with
            # it, ids go on
            self._end_tracks(list(self._known_tracks()), events)
            if self._tracker is not None:
                self._tracker.restart()
        state.session, state.last_seq, state.last_time = message.session, message.seq, now
        if self._tracker is None:
            return FrameAnalytics(filtered, ())
        track_ids, ended = self._tracker.update(detections, now)
        self._note_tracks(detections, track_ids, now, events)
        if geometry is not None:  # with no track in sight too: lines forget the absent
            confirmed = track_ids >= 0
            if confirmed.all():  # no copies
                self._count(detections, track_ids, now, events)
            else:
                self._count(detections[confirmed], track_ids[confirmed], now, events)
        self._end_tracks(ended, events)
        published = tuple(
            d.tracked(t if t >= 0 else None)
            for d, t in zip(originals, track_ids.tolist(), strict=True)
        )
        return FrameAnalytics(replace(message, detections=published), tuple(events.events))

    def occupancy(self) -> dict[str, dict[str, int]]:
        """Tracks in each zone now, by the label they entered with."""
        return {
            name: {self._label(c): n for c, n in zone.occupancy().items()}
            for name, zone in self.state.zones.items()
        }

    def _geometry_for(self, message: DetectionMessage) -> FrameGeometry | None:
        if not (self._config.zones or self._config.lines or self._config.masks):
            return None
        geometry = self._geometry
        if geometry is None or (geometry.width, geometry.height) != (message.width, message.height):
            try:
                geometry = FrameGeometry.resolve(
                    self._config, message.width, message.height, self._where
                )
            except RegionDoesNotFit as exc:
                raise BadInput(str(exc)) from None
            self._geometry = geometry
            self._lines = {
                name: LineCounter(
                    *geometry.lines[name], line.min_crossing_frames, self.state.lines[name]
                )
                for name, line in self._config.lines.items()
            }
        return geometry

    def _known_tracks(self) -> dict[int, TrackInfo]:
        return self._tracker.state.tracks if self._tracker is not None else {}

    def _note_tracks(
        self, detections: sv.Detections, track_ids: np.ndarray, now: float, events: _Events
    ) -> None:
        tracks = self._known_tracks()
        # plain Python numbers, converted once (per element from numpy they cost 0.15 ms a
        # frame at 50 objects)
        boxes = detections.xyxy.tolist()
        classes, scores = detections.class_id.tolist(), detections.confidence.tolist()
        for index, track in enumerate(track_ids.tolist()):
            if track < 0:
                continue
            box, class_id, score = tuple(boxes[index]), classes[index], scores[index]
            info = tracks.get(track)
            if info is None:
                info = tracks[track] = TrackInfo(class_id, score, box, now, now)  # type: ignore[arg-type]
                events.add("track_start", track, info)
            else:
                info.class_id, info.score, info.box, info.seen = class_id, score, box, now  # type: ignore[assignment]

    def _count(
        self, detections: sv.Detections, track_ids: np.ndarray, now: float, events: _Events
    ) -> None:
        tracks = self._known_tracks()
        for name, counter in self._lines.items():
            chosen, ids = _of_classes(detections, track_ids, self._line_classes[name])
            cls = chosen.class_id
            points = anchors(chosen, self._config.lines[name].anchor)
            for index, direction in counter.update(ids, cls, points):
                count = counter.state.counts[(direction, int(cls[index]))]
                info = tracks[int(ids[index])]
                events.add("line_cross", int(ids[index]), info, name, direction, count=count)
        for name, counter in self._zones.items():
            chosen, ids = _of_classes(detections, track_ids, self._zone_classes[name])
            inside = (
                self._geometry.zones[name].trigger(chosen)  # type: ignore[union-attr]
                if len(chosen)
                else np.zeros(0, dtype=bool)
            )
            for kind, _index, track, dwell in counter.update(ids, chosen.class_id, inside, now):
                count = _zone_count(counter, kind, tracks[track].class_id)
                events.add(kind, track, tracks[track], name, dwell_s=dwell, count=count)  # type: ignore[arg-type]

    def _end_tracks(self, ended: list[int], events: _Events) -> None:
        """Tracks the tracker gave up on (or all, at a restart): they leave their zones when
        they were last seen, not when the tracker stopped waiting for them."""
        tracks = self._known_tracks()
        for track in ended:
            info = tracks.pop(track)
            for name, counter in self._zones.items():
                change = counter.end_track(track, info.seen)
                if change is not None:
                    count = _zone_count(counter, "zone_exit", info.class_id)
                    events.add("zone_exit", track, info, name, dwell_s=change[3], count=count)
            events.add("track_end", track, info, dwell_s=info.seen - info.started)


class _Events:
    """A frame's events as they happen, numbered in that order."""

    def __init__(self, message: DetectionMessage, label: Callable[[int], str]):
        self._message = message
        self._label = label
        self.events: list[ObjectEvent] = []

    def add(
        self,
        kind: EventKind,
        track: int,
        info: TrackInfo,
        region: str = "",
        direction: str = "",
        *,
        dwell_s: float | None = None,
        count: int | None = None,
    ) -> None:
        message = self._message
        self.events.append(
            ObjectEvent(
                kind=kind,
                camera=message.camera,
                session=message.session,
                seq=message.seq,
                index=len(self.events),
                pts=message.pts,
                time=message.timestamps.captured,
                track_id=track,
                class_id=info.class_id,
                label=self._label(info.class_id),
                score=info.score,
                box=info.box,
                region=region,
                direction=direction,
                dwell_s=dwell_s,
                count=count,
            )
        )


def _zone_count(counter: ZoneCounter, kind: str, class_id: int) -> int | None:
    """Tracks of ``class_id`` in the zone now, for its entries and exits."""
    if kind not in ("zone_enter", "zone_exit"):
        return None
    return counter.state.occupancy()[class_id]


def _as_detections(detections: tuple[Detection, ...]) -> sv.Detections:
    if not detections:
        return sv.Detections.empty()
    return sv.Detections(
        xyxy=np.array([d.box for d in detections], dtype=float),
        confidence=np.array([d.score for d in detections], dtype=float),
        class_id=np.array([d.class_id for d in detections], dtype=int),
    )


def _of_classes(
    detections: sv.Detections, track_ids: np.ndarray, chosen: frozenset[int] | None
) -> tuple[sv.Detections, np.ndarray]:
    """The detections of the ``chosen`` classes (``None``: every class) and their track ids,
    not copied where that is all of them."""
    if chosen is None:
        return detections, track_ids
    keep = np.isin(detections.class_id, list(chosen))
    if keep.all():
        return detections, track_ids
    return detections[keep], track_ids[keep]
