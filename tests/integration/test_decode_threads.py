"""Decoding on one thread or with FFmpeg's frame threading (``decode_threads``): real H.264 frames
are the same either way, and a corrupt file's lost frames are counted either way."""

from __future__ import annotations

import numpy as np
import pytest

from streams.sources import VideoSource
from tests.conftest import SAMPLE_CLIPS, VIDEOS

pytestmark = pytest.mark.integration


def decode(url: str, threads: int) -> tuple[list[np.ndarray], VideoSource]:
    with VideoSource("cam", url, decode_threads=threads) as source:
        images = [frame.image for frame in source.frames()]
    return images, source


def test_one_thread_and_frame_threading_give_the_same_frames(assets):
    url = str(VIDEOS / "highway_traffic_1920x1080_30fps_20frames.mp4")
    single, _ = decode(url, threads=1)
    threaded, _ = decode(url, threads=0)
    assert len(single) == len(threaded) == 20
    assert all(np.array_equal(a, b) for a, b in zip(single, threaded, strict=True))


@pytest.mark.parametrize("threads", [0, 1])
def test_a_corrupt_file_counts_each_lost_frame(threads):
    images, source = decode(str(SAMPLE_CLIPS / "corrupt_truncated.mp4"), threads)
    assert source.packets == 15
    assert len(images) == source.frames_out and source.frames_out >= 10
    assert source.frames_out + source.decode_errors == source.packets
