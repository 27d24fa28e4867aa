"""Per-camera sampling end to end: ``vid_stride`` and ``max_fps`` on a real replay.  Frames
not taken are decoded but never sent; they get no seq and are counted as ``sampled_out``,
outside decoded = processed + dropped."""

from __future__ import annotations

import pytest

from framebatch_tools.audit import audit
from streams.keys import StreamKeys
from tests.conftest import MODEL, VIDEOS
from tests.integration.runner import published, run_until_done, write_config

pytestmark = [pytest.mark.integration]

CLIP = VIDEOS / "highway_traffic_960x540_30fps.mp4"  # 335 frames at 29.97 fps
FRAMES = 335


def test_stride_and_max_fps_take_the_frames_they_say(assets, redis_url, redis_client, tmp_path):
    config = write_config(
        tmp_path / "sampling.yaml",
        model=MODEL,
        cameras=[
            {"id": "stride", "url": str(CLIP), "vid_stride": 3},
            {"id": "capped", "url": str(CLIP), "max_fps": 5},
        ],
        redis_url=redis_url,
        prefix="sampling",
    )
    result = run_until_done(config)
    assert result.returncode == 0, result.stderr
    cameras = {c["camera"]: c for c in result.summary["cameras"]}

    stride = cameras["stride"]
    assert stride["decoded"] == stride["processed"] == 112  # frames 0, 3, ..., 333
    assert stride["sampled_out"] == FRAMES - 112 and stride["dropped"] == {}
    messages = published(redis_client, "sampling", "stride")
    assert [m.seq for m in messages] == list(range(112))
    frame_s = 1001 / 30000
    assert all(m.pts == pytest.approx(3 * m.seq * frame_s, abs=1e-3) for m in messages)

    capped = cameras["capped"]
    seconds = FRAMES * frame_s  # 11.2 s of stream time
    assert abs(capped["processed"] - 5 * seconds) <= 1
    assert capped["decoded"] == capped["processed"]
    assert capped["sampled_out"] == FRAMES - capped["processed"]
    pts = [m.pts for m in published(redis_client, "sampling", "capped")]
    gaps = [b - a for a, b in zip(pts, pts[1:], strict=False)]
    assert min(gaps) >= 0.2 - frame_s  # never two frames closer than the cap allows

    reports = audit(redis_client, StreamKeys("sampling"), ["stride", "capped"])
    assert all(r.ok for r in reports), [r.line() for r in reports]
    assert "(+223 sampled out)" in result.stdout
