"""The mixed-shape bench's padding is the letterbox to the larger shape, pixel for pixel."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.preprocess import Letterbox
from framebatch_tools.bench.shapes import crop_4_3, pad_to


@pytest.mark.parametrize("size", [(960, 540), (1920, 1080), (768, 432), (1280, 721)])
def test_padding_a_rect_frame_equals_letterboxing_it_to_the_larger_shape(size):
    width, height = size
    frame = np.random.default_rng(width).integers(0, 256, (height, width, 3), np.uint8)
    rect = Letterbox(640, 640, rect=True)(frame)
    padded = pad_to(rect, 480, 640)
    direct = Letterbox(640, 480)(frame)
    assert rect.pixels.shape[0] < 480
    assert np.array_equal(padded.pixels, direct.pixels)
    assert padded.geometry == direct.geometry


def test_the_4_3_crop_is_centred_and_4_3():
    frame = np.arange(540 * 960 * 3, dtype=np.uint32).reshape(540, 960, 3)
    crop = crop_4_3(frame)
    assert crop.shape[:2] == (540, 720)
    assert np.array_equal(crop, frame[:, 120:840])
    assert Letterbox(640, 640, rect=True).shape_for(720, 540) == (480, 640)
