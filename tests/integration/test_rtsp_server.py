"""The loopback RTSP test server delivers a decodable, endless H.264 stream."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from streams.rtsp_replay import rtsp_server_available, serve_rtsp

av = pytest.importorskip("av")

pytestmark = pytest.mark.integration

# The shared assets live beside the repository checkout.
CLIP = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "assets"
    / "videos"
    / "highway_traffic_960x540_30fps.mp4"
)
PYAV_OPTIONS = {"rtsp_transport": "tcp", "probesize": "32768", "analyzeduration": "0"}


def test_rtsp_server_streams_clip_frames() -> None:
    if not CLIP.is_file():
        pytest.skip(f"test clip not found: {CLIP}")
    ok, reason = rtsp_server_available()
    if not ok:
        pytest.skip(reason)

    want, budget_s = 40, 20.0
    with serve_rtsp(CLIP) as url:
        start = time.monotonic()
        sizes: list[tuple[int, int]] = []
        with av.open(url, options=PYAV_OPTIONS, timeout=(5, 5)) as container:
            for frame in container.decode(video=0):
                sizes.append((frame.width, frame.height))
                if len(sizes) >= want or time.monotonic() - start > budget_s:
                    break
        elapsed = time.monotonic() - start

    assert len(sizes) == want, f"stream ended after {len(sizes)} frames"
    assert elapsed <= budget_s, f"{want} frames took {elapsed:.1f}s"
    assert set(sizes) == {(960, 540)}
