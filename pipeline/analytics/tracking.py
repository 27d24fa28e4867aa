"""A camera's tracker: ByteTrack from Roboflow's ``trackers`` package (Apache-2.0), stepped by
the stream time of each frame, so frames sampled out or dropped between two are a longer step,
not a lost track.

Track ids are the tracker's, offset so that they stay unique on the camera when its tracker
starts over (a new decoder session): ``id_base`` moves past every id handed out before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import supervision as sv
from trackers import ByteTrackTracker

from pipeline.analytics.state import TrackInfo
from pipeline.config.analytics import TrackerConfig

#: ByteTrack's ``lost_track_buffer`` counts frames of a 30 fps stream; with timestamps it is a
#: time budget of ``lost_track_buffer / 30`` seconds whatever the camera's rate.
_REFERENCE_FPS = 30


def bytetrack(config: TrackerConfig) -> ByteTrackTracker:
    """The library's tracker for these settings (the tests' reference builds it here too)."""
    return ByteTrackTracker(
        lost_track_buffer=round(config.lost_track_s * _REFERENCE_FPS),
        frame_rate=_REFERENCE_FPS,
        track_activation_threshold=config.activation_score,
        minimum_consecutive_frames=config.confirm_frames,
        minimum_iou_threshold=config.match_iou,
        high_conf_det_threshold=config.high_score,
    )


@dataclass
class TrackerState:
    tracker: ByteTrackTracker
    config: TrackerConfig  # the settings ``tracker`` was made with
    id_base: int = 0
    next_local_id: int = 0  # past the largest id the tracker has given
    tracks: dict[int, TrackInfo] = field(default_factory=dict)  # confirmed and alive


class CameraTracker:
    def __init__(self, config: TrackerConfig, state: TrackerState | None = None):
        self._config = config
        self.state = state or TrackerState(bytetrack(config), config)

    @property
    def settings_changed(self) -> bool:
        """The state's tracker was made with other settings (changed live, or in the config
        of a restarted daemon): it starts over at the next frame, its tracks ended."""
        return self.state.config != self._config

    def update(self, detections: sv.Detections, now: float) -> tuple[np.ndarray, list[int]]:
        """Track ids for ``detections`` (in their order; -1 where the track is not confirmed)
        and the ids of tracks that ended with this frame."""
        state = self.state
        indexed = detections[:]  # the tracker may reorder its output
        indexed.data["index"] = np.arange(len(detections))
        tracked = state.tracker.update(indexed, timestamp=now)
        ids = np.full(len(detections), -1, dtype=int)
        if len(tracked):
            local = tracked.tracker_id
            confirmed = local >= 0
            if confirmed.any():
                state.next_local_id = max(state.next_local_id, int(local.max()) + 1)
            ids[tracked.data["index"][confirmed]] = local[confirmed] + state.id_base
        alive = {t.tracker_id + state.id_base for t in state.tracker.tracks if t.tracker_id >= 0}
        ended = sorted(track for track in state.tracks if track not in alive)
        return ids, ended

    def restart(self) -> None:
        """A new tracker whose ids follow on from this one's (every track has ended)."""
        state = self.state
        state.id_base += state.next_local_id
        state.next_local_id = 0
        state.tracker = bytetrack(self._config)
        state.config = self._config
        state.tracks.clear()
