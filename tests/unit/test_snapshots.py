"""Event snapshots: what a JPEG shows (the frame the detector saw without its padding, or the
object's box with a margin), a store that writes whole files named after the event and keeps
to its caps, and the settings' rules (pure logic on a temporary folder)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from detectors.preprocess import LetterboxGeometry
from pipeline.analytics.snapshots import FramePicture, SnapshotStore, render, snapshot_name
from pipeline.config import CameraConfig
from pipeline.config.analytics import AnalyticsConfig, SnapshotConfig
from pipeline.config.errors import ConfigError
from pipeline.config.loading import parse_config
from streams.object_events import ObjectEvent
from tests.object_events import sample_event

# a 960x540 frame letterboxed to 640x640: scale 2/3, 140 rows of padding above and below
GEOMETRY = LetterboxGeometry(width=960, height=540, scale=2 / 3, pad_x=0, pad_y=140)


def picture() -> FramePicture:
    pixels = np.full((640, 640, 3), 114, np.uint8)  # the letterbox grey
    pixels[140:500] = 30  # the frame's content
    return FramePicture(pixels, GEOMETRY)


def event(box=(300.0, 150.0, 450.0, 300.0)) -> ObjectEvent:
    return sample_event(camera="road", session="s1", seq=7, index=0, track_id=3, box=box)


def decoded(jpeg: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)


def test_a_whole_frame_snapshot_is_the_content_without_padding():
    image = decoded(render(picture(), event(), SnapshotConfig(bounding_box=False)))
    assert image.shape == (360, 640, 3)
    assert abs(int(image.mean()) - 30) <= 2  # none of the grey padding


def test_the_box_is_drawn_where_the_object_is():
    image = decoded(render(picture(), event(), SnapshotConfig()))
    # the box (300,150)-(450,300) in source pixels is (200,100)-(300,200) in the snapshot
    assert image[100, 250].max() > 150  # on its top edge
    assert image[150, 250].max() < 60  # inside it: the frame as it was


def test_a_crop_is_the_box_with_its_margin_clipped_to_the_frame():
    settings = SnapshotConfig(crop=True, margin=0.25, bounding_box=False)
    image = decoded(render(picture(), event(), settings))
    assert image.shape[:2] == (150, 150)  # 100 px box + 25 px each side, in model pixels
    corner = decoded(render(picture(), event(box=(0.0, 0.0, 150.0, 150.0)), settings))
    assert corner.shape[:2] == (125, 125)  # the margin outside the frame is cut


def test_files_are_named_after_the_event_and_written_whole(tmp_path):
    store = SnapshotStore(tmp_path, max_bytes=10**6, max_age_s=3600)
    relative = store.write("road", "s1:7:0", b"jpeg")
    assert relative == f"road/{snapshot_name('s1:7:0')}" and ":" not in Path(relative).name
    assert (tmp_path / relative).read_bytes() == b"jpeg"
    assert store.write("road", "s1:7:0", b"again") == relative  # analysed again: one file
    assert store.path("s1:7:0") == tmp_path / relative
    assert store.path("s1:8:0") is None
    assert [p.name for p in (tmp_path / "road").iterdir()] == [Path(relative).name]


def aged(store: SnapshotStore, root: Path, name: str, size: int, age_s: float, now: float):
    path = root / store.write("road", name, b"x" * size)
    os.utime(path, (now - age_s, now - age_s))
    return path


@pytest.mark.parametrize("cap", ["age", "size"])
def test_the_sweep_removes_the_oldest_past_either_cap(tmp_path, cap):
    now = time.time()
    store = SnapshotStore(
        tmp_path,
        max_bytes=250 if cap == "size" else 10**6,
        max_age_s=3600 if cap == "age" else 10**6,
    )
    oldest = aged(store, tmp_path, "a:1:0", 100, 7200, now)
    middle = aged(store, tmp_path, "a:2:0", 100, 1800, now)
    newest = aged(store, tmp_path, "a:3:0", 100, 60, now)
    partial = tmp_path / "road" / ".part-crashed"
    partial.write_bytes(b"half")
    os.utime(partial, (now - 3600, now - 3600))
    assert store.sweep(now) == 1
    assert not oldest.exists() and middle.exists() and newest.exists()
    assert not partial.exists()  # a write a crash cut short


def test_snapshots_need_a_tracker_and_the_folder_follows_the_config():
    with pytest.raises(ValueError, match="tracker"):
        AnalyticsConfig.model_validate({"snapshots": {}})
    data = {
        "model": {"path": "m.onnx"},
        "cameras": [{"id": "c", "url": "/x.mp4"}],
    }
    config = parse_config(data, base_dir=Path("/srv/site"), environ={})
    assert config.snapshots.path == Path("/srv/site/snapshots")
    with pytest.raises(ConfigError, match=r"snapshots\.max_size_mb"):
        parse_config({**data, "snapshots": {"max_size_mb": 0}}, base_dir="/srv", environ={})
    with pytest.raises(ValueError, match="kinds"):
        SnapshotConfig.model_validate({"kinds": ["track_end"]})


def test_a_snapshot_swept_after_the_look_is_none_not_an_error(tmp_path):
    store = SnapshotStore(tmp_path, max_bytes=10**6, max_age_s=3600)
    relative = store.write("road", "s1:7:0", b"jpeg")
    assert store.read("s1:7:0") == b"jpeg"
    (tmp_path / relative).unlink()
    assert store.read("s1:7:0") is None


@pytest.mark.parametrize("camera", [".", ".."])
def test_a_camera_id_of_dots_is_refused_it_would_name_another_folder(camera):
    with pytest.raises(ValueError, match="not dots only"):
        CameraConfig.model_validate({"id": camera, "url": "/x.mp4"})
