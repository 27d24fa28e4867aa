"""Letterbox against the Ultralytics ``LetterBox`` formula (rect=False, scaleup, pad 114)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from detectors.preprocess import PAD_VALUE, Letterbox, LetterboxGeometry

FRAME_SIZES = [  # (width, height)
    (1920, 1080),
    (960, 540),
    (768, 432),
    (640, 640),
    (100, 1000),  # portrait
    (641, 479),  # odd sizes
    (479, 641),
    (1280, 721),
    (320, 180),  # smaller than the input: scaled up
    (33, 17),
    (640, 360),  # no resize needed
]

TARGETS = [(640, 640), (640, 384), (320, 320)]  # (width, height)


def ultralytics_letterbox(
    width: int, height: int, new_width: int, new_height: int
) -> tuple[float, tuple[int, int], tuple[int, int, int, int]]:
    """Ultralytics ``LetterBox.__call__`` (auto=False, scaleup=True, center=True), written out.

    Returns the ratio, ``new_unpad`` as (w, h), and (top, bottom, left, right) padding.
    """
    r = min(new_height / height, new_width / width)
    new_unpad = int(round(width * r)), int(round(height * r))
    dw, dh = new_width - new_unpad[0], new_height - new_unpad[1]
    dw /= 2
    dh /= 2
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    return r, new_unpad, (top, bottom, left, right)


def frame(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A noisy BGR frame whose pixels never equal the pad value."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 200, size=(height, width, 3), dtype=np.uint8)
    pixels[pixels == PAD_VALUE] = 0
    return pixels


@pytest.mark.parametrize(("target_w", "target_h"), TARGETS)
@pytest.mark.parametrize(("width", "height"), FRAME_SIZES)
def test_geometry_matches_ultralytics(
    width: int, height: int, target_w: int, target_h: int
) -> None:
    r, (unpad_w, unpad_h), (top, bottom, left, right) = ultralytics_letterbox(
        width, height, target_w, target_h
    )
    geometry, resized_w, resized_h = Letterbox(target_w, target_h).geometry(width, height)
    assert geometry == LetterboxGeometry(width, height, r, left, top)
    assert (resized_w, resized_h) == (unpad_w, unpad_h)
    # the padding and the content tile the input exactly
    assert top + unpad_h + bottom == target_h
    assert left + unpad_w + right == target_w


@pytest.mark.parametrize(
    ("width", "height", "scale", "resized", "pad_x", "pad_y"),
    [  # hand-computed for 640x640
        (1920, 1080, 1 / 3, (640, 360), 0, 140),
        (960, 540, 2 / 3, (640, 360), 0, 140),
        (768, 432, 5 / 6, (640, 360), 0, 140),
        (640, 640, 1.0, (640, 640), 0, 0),
        (100, 1000, 0.64, (64, 640), 288, 0),
        (641, 479, 640 / 641, (640, 478), 0, 81),
        (1280, 721, 0.5, (640, 360), 0, 140),  # 360.5 rounds half to even; dh 140 exactly
        (33, 17, 640 / 33, (640, 330), 0, 155),
    ],
)
def test_geometry_hand_computed(
    width: int,
    height: int,
    scale: float,
    resized: tuple[int, int],
    pad_x: int,
    pad_y: int,
) -> None:
    geometry, resized_w, resized_h = Letterbox().geometry(width, height)
    assert geometry.scale == pytest.approx(scale)
    assert (resized_w, resized_h) == resized
    assert (geometry.pad_x, geometry.pad_y) == (pad_x, pad_y)
    assert (geometry.width, geometry.height) == (width, height)


@pytest.mark.parametrize(("half_pad", "top_or_left"), [(0.5, 0), (1.5, 1), (2.5, 2), (3.0, 3)])
def test_odd_padding_goes_right_or_bottom(half_pad: float, top_or_left: int) -> None:
    # a 640 x (640 - 2 * half_pad) frame needs no scaling; the odd pixel lands at the bottom
    height = int(640 - 2 * half_pad)
    geometry, _, resized_h = Letterbox().geometry(640, height)
    assert resized_h == height
    assert geometry.pad_y == top_or_left
    assert 640 - height - geometry.pad_y >= geometry.pad_y


@pytest.mark.parametrize(("target_w", "target_h"), TARGETS)
@pytest.mark.parametrize(("width", "height"), FRAME_SIZES)
def test_pixels_are_resized_content_inside_pad_114(
    width: int, height: int, target_w: int, target_h: int
) -> None:
    image = frame(width, height)
    original = image.copy()
    _, (unpad_w, unpad_h), (top, bottom, left, right) = ultralytics_letterbox(
        width, height, target_w, target_h
    )

    result = Letterbox(target_w, target_h)(image)

    out = result.pixels
    assert out.shape == (target_h, target_w, 3)
    assert out.dtype == np.uint8
    expected_interior = cv2.resize(image, (unpad_w, unpad_h), interpolation=cv2.INTER_LINEAR)
    interior = (slice(top, top + unpad_h), slice(left, left + unpad_w))
    np.testing.assert_array_equal(out[interior], expected_interior)
    border = np.ones((target_h, target_w), bool)
    border[interior] = False
    assert border.sum() == target_h * target_w - unpad_h * unpad_w
    assert np.all(out[border] == PAD_VALUE)
    assert (top + unpad_h + bottom, left + unpad_w + right) == (target_h, target_w)
    assert result.geometry == Letterbox(target_w, target_h).geometry(width, height)[0]
    np.testing.assert_array_equal(image, original)  # the input is not modified


def test_matches_copy_make_border_pipeline() -> None:
    """The whole image equals Ultralytics' resize + ``cv2.copyMakeBorder`` result."""
    image = frame(1280, 721, seed=3)
    _, new_unpad, (top, bottom, left, right) = ultralytics_letterbox(1280, 721, 640, 640)
    resized = cv2.resize(image, new_unpad, interpolation=cv2.INTER_LINEAR)
    expected = cv2.copyMakeBorder(
        resized, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114)
    )
    np.testing.assert_array_equal(Letterbox()(image).pixels, expected)


def test_channel_order_is_kept() -> None:
    image = np.zeros((360, 640, 3), np.uint8)
    image[..., 0], image[..., 1], image[..., 2] = 10, 20, 30
    out = Letterbox()(image).pixels
    np.testing.assert_array_equal(out[320, 320], [10, 20, 30])
    np.testing.assert_array_equal(out[0, 0], [PAD_VALUE] * 3)


def test_output_is_contiguous_and_owned() -> None:
    image = frame(640, 640)
    out = Letterbox()(image).pixels
    assert out.flags["C_CONTIGUOUS"]
    assert not np.shares_memory(out, image)


@pytest.mark.parametrize("rect", [False, True], ids=["square", "rect"])
@pytest.mark.parametrize(("width", "height"), FRAME_SIZES)
def test_pixels_equal_ultralytics_letterbox(width: int, height: int, rect: bool) -> None:
    """Pixel for pixel what Ultralytics' own ``LetterBox`` (auto = rect) makes."""
    augment = pytest.importorskip("ultralytics.data.augment", reason="the ultralytics extra")
    image = frame(width, height, seed=width)
    expected = augment.LetterBox((640, 640), auto=rect, stride=32)(image=image.copy())
    result = Letterbox(640, 640, rect=rect)(image)
    assert result.pixels.shape == expected.shape
    np.testing.assert_array_equal(result.pixels, expected)


@pytest.mark.parametrize(
    ("width", "height", "shape"),
    [  # (width, height) of the letterboxed image with rect, 640 and stride 32
        (1920, 1080, (640, 384)),
        (960, 540, (640, 384)),
        (768, 432, (640, 384)),
        (640, 640, (640, 640)),
        (100, 1000, (64, 640)),
        (641, 479, (640, 480)),
        (33, 17, (640, 352)),
    ],
)
def test_rect_pads_to_the_next_multiple_of_the_stride(width, height, shape) -> None:
    letterbox = Letterbox(640, 640, rect=True)
    out = letterbox(frame(width, height)).pixels
    assert (out.shape[1], out.shape[0]) == shape
    assert letterbox.shape_for(width, height) == out.shape[:2]
    assert out.nbytes <= letterbox.max_bytes
