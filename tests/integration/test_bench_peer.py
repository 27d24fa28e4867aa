"""``framebatch bench --peer ultralytics`` runs both sides on the same frames and model and
reports each side's frames and detections (a tiny config: the figures are not the point)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import MODEL_ANY_SIZE, VIDEOS
from tests.integration.runner import framebatch, write_config

pytestmark = [pytest.mark.integration]


def test_both_sides_process_every_frame_and_find_the_same_boxes(assets, tmp_path):
    pytest.importorskip("ultralytics", reason="the ultralytics extra")
    clip = VIDEOS / "street_night_1920x1080_3fps.mp4"  # 8 frames
    config = write_config(
        tmp_path / "peer.yaml",
        model=MODEL_ANY_SIZE,
        cameras=[{"id": "a", "url": str(clip)}, {"id": "b", "url": str(clip)}],
        redis_url=None,
    )
    output = tmp_path / "peer.json"
    proc = framebatch(
        "bench",
        "--peer",
        "ultralytics",
        "--config",
        str(config),
        "--rounds",
        "1",
        "--output",
        str(output),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (round_,) = json.loads(output.read_text())["rounds"]
    ours, peer = round_["framebatch"], round_["ultralytics"]
    assert ours["frames"] == peer["frames"] == 16 and ours["dropped"] == 0
    assert ours["detections"] == peer["detections"] > 0
    assert round_["ratio_wall"] > 0


def test_live_mode_runs_both_sides_on_rtsp_cameras(assets, tmp_path):
    pytest.importorskip("ultralytics", reason="the ultralytics extra")
    from streams.rtsp_replay import rtsp_server_available

    available, why = rtsp_server_available()
    if not available:
        pytest.skip(why)
    clip = VIDEOS / "street_night_1920x1080_3fps.mp4"  # looped at 3 frames/s
    config = write_config(
        tmp_path / "live.yaml",
        model=MODEL_ANY_SIZE,
        cameras=[{"id": "a", "url": str(clip)}],
        redis_url=None,
    )
    output = tmp_path / "live.json"
    proc = framebatch(
        "bench", "--peer", "ultralytics", "--config", str(config), "--live", "4",
        "--rounds", "1", "--output", str(output), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(output.read_text())
    (round_,) = report["rounds"]
    ours, peer = round_["framebatch"], round_["ultralytics"]
    assert ours["frames"] > 0 and peer["frames"] > 0 and peer["detections"] > 0
    assert 0 < ours["latency_p99_s"] < 10
    assert report["median"]["ratio_window"] > 0
