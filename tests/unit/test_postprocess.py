"""YOLOv8 decode, class-aware NMS and mapping back to original pixels, on hand-built outputs."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.postprocess import MAX_NMS, MAX_WH, Thresholds, nms, postprocess
from detectors.preprocess import Letterbox, LetterboxGeometry

NUM_CLASSES = 80
IDENTITY = LetterboxGeometry(width=640, height=640, scale=1.0, pad_x=0, pad_y=0)


def raw_output(
    *images: list[tuple[float, float, float, float, int, float]], anchors: int | None = None
) -> np.ndarray:
    """A (N, 84, anchors) float32 output: one anchor per (cx, cy, w, h, class_id, score).

    Unused anchors (and unused class rows) are all zero, as a model gives for empty background.
    """
    anchors = anchors or max([len(rows) for rows in images] + [1])
    raw = np.zeros((len(images), 4 + NUM_CLASSES, anchors), np.float32)
    for n, rows in enumerate(images):
        for a, (cx, cy, w, h, class_id, score) in enumerate(rows):
            raw[n, :4, a] = cx, cy, w, h
            raw[n, 4 + class_id, a] = score
    return raw


def exact_iou(a: np.ndarray, b: np.ndarray) -> Fraction:
    ax1, ay1, ax2, ay2 = (Fraction(float(v)) for v in a)
    bx1, by1, bx2, by2 = (Fraction(float(v)) for v in b)
    inter = max(Fraction(0), min(ax2, bx2) - max(ax1, bx1)) * max(
        Fraction(0), min(ay2, by2) - max(ay1, by1)
    )
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union else Fraction(0)


def reference_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> list[int]:
    """Brute force, exact arithmetic: keep a box unless a kept higher-scored box overlaps it
    by more than the threshold (ties in score: lower index first)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    keep: list[int] = []
    threshold = Fraction(str(iou_threshold))  # the decimal the caller meant, not its binary float
    for i in order:
        if all(exact_iou(boxes[i], boxes[k]) <= threshold for k in keep):
            keep.append(i)
    return keep


# --- nms ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("boxes", "scores", "iou_threshold", "expected"),
    [
        ([], [], 0.45, []),
        ([[0, 0, 10, 10]], [0.5], 0.45, [0]),
        # identical boxes: only the best survives
        ([[0, 0, 10, 10], [0, 0, 10, 10]], [0.4, 0.9], 0.45, [1]),
        # IoU exactly 0.5 (areas 2 and 1, overlap 1): kept at 0.5, suppressed just below
        ([[0, 0, 2, 1], [0, 0, 1, 1]], [0.9, 0.8], 0.5, [0, 1]),
        ([[0, 0, 2, 1], [0, 0, 1, 1]], [0.9, 0.8], 0.4999, [0]),
        # touching edges: IoU 0, kept even at threshold 0
        ([[0, 0, 1, 1], [1, 0, 2, 1]], [0.9, 0.8], 0.0, [0, 1]),
        # any overlap suppresses at threshold 0
        ([[0, 0, 2, 2], [1, 1, 3, 3]], [0.9, 0.8], 0.0, [0]),
        # threshold 1: nothing suppressed, not even identical boxes
        ([[0, 0, 4, 4], [0, 0, 4, 4]], [0.9, 0.8], 1.0, [0, 1]),
        # result ordered by score, highest first
        ([[0, 0, 1, 1], [5, 5, 6, 6], [9, 9, 10, 10]], [0.2, 0.9, 0.5], 0.45, [1, 2, 0]),
        # chain: b suppressed by a, so c (overlapping only b) is kept
        ([[0, 0, 10, 10], [4, 0, 14, 10], [9, 0, 19, 10]], [0.9, 0.8, 0.7], 0.3, [0, 2]),
        # zero-area boxes never overlap anything
        ([[5, 5, 5, 5], [5, 5, 5, 5]], [0.9, 0.8], 0.45, [0, 1]),
    ],
)
def test_nms_cases(
    boxes: list[list[float]], scores: list[float], iou_threshold: float, expected: list[int]
) -> None:
    kept = nms(
        np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores, np.float64), iou_threshold
    )
    assert kept.dtype == np.int64
    assert kept.tolist() == expected


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("iou_threshold", [0.1, 0.45, 0.7])
def test_nms_matches_brute_force_on_random_boxes(seed: int, iou_threshold: float) -> None:
    rng = np.random.default_rng(seed)
    count = 60
    xy = rng.uniform(0, 200, size=(count, 2))
    wh = rng.uniform(1, 80, size=(count, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1)
    scores = rng.uniform(0, 1, size=count)
    assert nms(boxes, scores, iou_threshold).tolist() == reference_nms(boxes, scores, iou_threshold)


integer_box = st.tuples(
    st.integers(0, 64), st.integers(0, 64), st.integers(0, 32), st.integers(0, 32)
).map(lambda b: (b[0], b[1], b[0] + b[2], b[1] + b[3]))


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(st.tuples(integer_box, st.sampled_from([0.1, 0.3, 0.5, 0.7, 0.9])), max_size=25),
    iou_threshold=st.sampled_from([0.0, 0.25, 0.45, 0.5, 0.7, 1.0]),
)
def test_nms_matches_brute_force_with_ties_and_edges(
    data: list[tuple[tuple[int, int, int, int], float]], iou_threshold: float
) -> None:
    boxes = np.asarray([b for b, _ in data], np.float64).reshape(-1, 4)
    scores = np.asarray([s for _, s in data], np.float64)
    assert nms(boxes, scores, iou_threshold).tolist() == reference_nms(boxes, scores, iou_threshold)


# --- postprocess: thresholds and filters --------------------------------------------------

# two heavily overlapping boxes (IoU 0.82) and one far away
A = (100.0, 100.0, 50.0, 50.0)
A_SHIFTED = (104.0, 100.0, 50.0, 50.0)
FAR = (400.0, 400.0, 20.0, 20.0)


@pytest.mark.parametrize(
    ("rows", "thresholds", "expected_scores", "expected_classes"),
    [
        # same class, overlapping: the weaker is suppressed
        ([(*A, 0, 0.9), (*A_SHIFTED, 0, 0.8)], Thresholds(), [0.9], [0]),
        # different classes, overlapping: both kept (class-aware NMS)
        ([(*A, 0, 0.9), (*A_SHIFTED, 2, 0.8)], Thresholds(), [0.9, 0.8], [0, 2]),
        # the same with identical boxes
        ([(*A, 5, 0.6), (*A, 7, 0.7)], Thresholds(), [0.7, 0.6], [7, 5]),
        # iou threshold above their overlap keeps both
        ([(*A, 0, 0.9), (*A_SHIFTED, 0, 0.8)], Thresholds(iou=0.9), [0.9, 0.8], [0, 0]),
        # conf is strictly greater: a score equal to conf is dropped
        ([(*A, 0, 0.25), (*FAR, 1, 0.2500001)], Thresholds(conf=0.25), [0.2500001], [1]),
        ([(*A, 0, 0.5), (*FAR, 1, 0.5)], Thresholds(conf=0.5), [], []),
        ([(*A, 0, 0.5), (*FAR, 1, 0.5)], Thresholds(conf=0.4999), [0.5, 0.5], [0, 1]),
        # classes filter
        ([(*A, 0, 0.9), (*FAR, 3, 0.8)], Thresholds(classes=(3,)), [0.8], [3]),
        ([(*A, 0, 0.9), (*FAR, 3, 0.8)], Thresholds(classes=(0, 3)), [0.9, 0.8], [0, 3]),
        ([(*A, 0, 0.9), (*FAR, 3, 0.8)], Thresholds(classes=(1, 2)), [], []),
        # the class filter applies after the best class is chosen; suppressed boxes of another
        # class cannot come back
        ([(*A, 0, 0.9), (*A_SHIFTED, 0, 0.8)], Thresholds(classes=(0,)), [0.9], [0]),
        # nothing above threshold
        ([], Thresholds(), [], []),
    ],
)
def test_postprocess_thresholds_and_filters(
    rows: list[tuple[float, float, float, float, int, float]],
    thresholds: Thresholds,
    expected_scores: list[float],
    expected_classes: list[int],
) -> None:
    (result,) = postprocess(raw_output(rows), [IDENTITY], thresholds)
    assert len(result) == len(expected_scores)
    np.testing.assert_allclose(result.scores, expected_scores, rtol=1e-6)
    assert result.class_ids.tolist() == expected_classes
    assert result.boxes.shape == (len(expected_scores), 4)


def test_best_class_per_anchor_decides_score_and_class() -> None:
    raw = raw_output([(*A, 0, 0.3)])
    raw[0, 4 + 17, 0] = 0.6  # the same anchor scores class 17 higher
    raw[0, 4 + 42, 0] = 0.5
    (result,) = postprocess(raw, [IDENTITY], Thresholds())
    assert result.class_ids.tolist() == [17]
    np.testing.assert_allclose(result.scores, [0.6])
    # a class filter on a runner-up class does not pick up that anchor
    (filtered,) = postprocess(raw, [IDENTITY], Thresholds(classes=(42,)))
    assert len(filtered) == 0
    raw[0, 4 + 5, 0] = 0.6  # a tie: the lower class index, as an argmax over every class gives
    (tied,) = postprocess(raw, [IDENTITY], Thresholds())
    assert tied.class_ids.tolist() == [5]


@pytest.mark.parametrize(("max_det", "expected"), [(1, 1), (3, 3), (10, 10), (300, 12)])
def test_max_det_caps_the_highest_scores(max_det: int, expected: int) -> None:
    rows = [(20.0 + 50 * i, 30.0, 10.0, 10.0, i % 3, 0.3 + 0.05 * i) for i in range(12)]
    (result,) = postprocess(raw_output(rows), [IDENTITY], Thresholds(max_det=max_det))
    assert len(result) == expected
    all_scores = sorted((r[5] for r in rows), reverse=True)
    np.testing.assert_allclose(result.scores, all_scores[:expected], rtol=1e-6)


def test_only_the_top_max_nms_candidates_enter_nms() -> None:
    # MAX_NMS identical high-scoring boxes collapse to one; five weaker far-away boxes would
    # survive NMS, but they are past the candidate cap
    anchors = MAX_NMS + 5
    raw = np.zeros((1, 4 + NUM_CLASSES, anchors), np.float32)
    raw[0, :4, :] = np.array(A, np.float32)[:, None]
    raw[0, 4, :MAX_NMS] = np.linspace(0.6, 0.9, MAX_NMS, dtype=np.float32)
    raw[0, :4, MAX_NMS:] = np.array([[500.0 + 10 * k, 500.0, 4.0, 4.0] for k in range(5)]).T
    raw[0, 4, MAX_NMS:] = 0.5
    (result,) = postprocess(raw, [IDENTITY], Thresholds())
    assert len(result) == 1
    np.testing.assert_allclose(result.scores, [0.9])


def test_class_offset_exceeds_any_input_coordinate() -> None:
    assert MAX_WH >= 640 * 4


# --- mapping back to original pixels ------------------------------------------------------


def expected_geometry(width: int, height: int) -> LetterboxGeometry:
    geometry, _, _ = Letterbox(640, 640).geometry(width, height)
    return geometry


@pytest.mark.parametrize(
    ("geometry", "cxcywh", "expected_xyxy"),
    [
        # 1280x720 -> scale 0.5, 640x360 content, pad_y 140
        (LetterboxGeometry(1280, 720, 0.5, 0, 140), (320, 320, 100, 50), (540, 310, 740, 410)),
        # clipped at the left/top ...
        (LetterboxGeometry(1280, 720, 0.5, 0, 140), (10, 150, 40, 40), (0, 0, 60, 60)),
        # ... and at the right/bottom, to the frame size itself
        (LetterboxGeometry(1280, 720, 0.5, 0, 140), (630, 490, 40, 40), (1220, 660, 1280, 720)),
        # a box entirely in the top padding collapses onto the edge
        (LetterboxGeometry(1280, 720, 0.5, 0, 140), (320, 50, 20, 20), (620, 0, 660, 0)),
        # portrait 360x640 -> scale 1, pad_x 140
        (LetterboxGeometry(360, 640, 1.0, 140, 0), (320, 320, 100, 100), (130, 270, 230, 370)),
        # upscaled 320x180 -> scale 2, pad_y 140
        (LetterboxGeometry(320, 180, 2.0, 0, 140), (100, 200, 40, 20), (40, 25, 60, 35)),
        # identity
        (IDENTITY, (320, 320, 640, 640), (0, 0, 640, 640)),
    ],
)
def test_boxes_map_back_to_original_pixels_and_clip(
    geometry: LetterboxGeometry,
    cxcywh: tuple[float, float, float, float],
    expected_xyxy: tuple[float, float, float, float],
) -> None:
    (result,) = postprocess(raw_output([(*cxcywh, 0, 0.9)]), [geometry], Thresholds())
    np.testing.assert_allclose(result.boxes, [expected_xyxy], atol=1e-3)


@pytest.mark.parametrize(("width", "height"), [(1280, 720), (1920, 1080), (641, 479), (100, 1000)])
def test_letterbox_geometry_round_trips_a_box(width: int, height: int) -> None:
    geometry = expected_geometry(width, height)
    # a box in original pixels, placed into the input the way the letterbox places pixels
    x1, y1, x2, y2 = 0.1 * width, 0.2 * height, 0.6 * width, 0.9 * height
    s = geometry.scale
    cx = (x1 + x2) / 2 * s + geometry.pad_x
    cy = (y1 + y2) / 2 * s + geometry.pad_y
    (result,) = postprocess(
        raw_output([(cx, cy, (x2 - x1) * s, (y2 - y1) * s, 0, 0.9)]), [geometry], Thresholds()
    )
    np.testing.assert_allclose(result.boxes, [[x1, y1, x2, y2]], rtol=1e-4, atol=0.02)


# --- batch invariance and shape checks ----------------------------------------------------


def random_raw(rng: np.random.Generator, images: int, anchors: int = 400) -> np.ndarray:
    raw = np.zeros((images, 4 + NUM_CLASSES, anchors), np.float32)
    raw[:, 0:2, :] = rng.uniform(0, 640, size=(images, 2, anchors))
    raw[:, 2:4, :] = rng.uniform(4, 160, size=(images, 2, anchors))
    # sparse class scores: most anchors are background, some have a few classes lit
    scores = rng.uniform(0, 1, size=(images, NUM_CLASSES, anchors)) ** 8
    raw[:, 4:, :] = scores.astype(np.float32)
    return raw


GEOMETRIES = [
    expected_geometry(1920, 1080),
    expected_geometry(640, 640),
    expected_geometry(100, 1000),
    expected_geometry(641, 479),
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "thresholds",
    [Thresholds(), Thresholds(conf=0.1, iou=0.7), Thresholds(max_det=5, classes=(0, 1, 2, 3))],
)
def test_batch_gives_the_same_detections_as_each_image_alone(
    seed: int, thresholds: Thresholds
) -> None:
    rng = np.random.default_rng(seed)
    raw = random_raw(rng, len(GEOMETRIES))
    batched = postprocess(raw, GEOMETRIES, thresholds)
    assert len(batched) == len(GEOMETRIES)
    assert sum(len(d) for d in batched) > 0
    for i, geometry in enumerate(GEOMETRIES):
        (alone,) = postprocess(raw[i : i + 1].copy(), [geometry], thresholds)
        np.testing.assert_array_equal(batched[i].boxes, alone.boxes)
        np.testing.assert_array_equal(batched[i].scores, alone.scores)
        np.testing.assert_array_equal(batched[i].class_ids, alone.class_ids)
    # and the same image in a different batch position and company
    reordered = postprocess(raw[::-1].copy(), GEOMETRIES[::-1], thresholds)
    for i in range(len(GEOMETRIES)):
        np.testing.assert_array_equal(reordered[-1 - i].boxes, batched[i].boxes)


def test_detections_are_sorted_by_score_and_inside_the_frame() -> None:
    rng = np.random.default_rng(7)
    raw = random_raw(rng, len(GEOMETRIES))
    for result, geometry in zip(
        postprocess(raw, GEOMETRIES, Thresholds(conf=0.05)), GEOMETRIES, strict=True
    ):
        assert len(result) > 0
        assert np.all(np.diff(result.scores) <= 0)
        assert np.all(result.boxes[:, [0, 2]] >= 0)
        assert np.all(result.boxes[:, [0, 2]] <= geometry.width)
        assert np.all(result.boxes[:, [1, 3]] >= 0)
        assert np.all(result.boxes[:, [1, 3]] <= geometry.height)
        assert np.all(result.boxes[:, 2] >= result.boxes[:, 0])
        assert np.all(result.boxes[:, 3] >= result.boxes[:, 1])


@pytest.mark.parametrize(
    ("shape", "geometries"),
    [
        ((2, 84, 10), [IDENTITY]),  # more outputs than images
        ((1, 84, 10), [IDENTITY, IDENTITY]),  # fewer
        ((84, 10), [IDENTITY]),  # missing batch axis
        ((1, 1, 84, 10), [IDENTITY]),
    ],
)
def test_output_shape_mismatch_raises(shape: tuple[int, ...], geometries: list) -> None:
    with pytest.raises(ValueError, match="expected output"):
        postprocess(np.zeros(shape, np.float32), geometries, Thresholds())


def test_empty_batch_gives_no_images() -> None:
    assert postprocess(np.zeros((0, 84, 10), np.float32), [], Thresholds()) == []
