"""On-device decode + NMS (torch) against the host path (numpy), on synthetic YOLOv8 outputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the framebatch[torch] extra) is not installed")

from detectors.device import nms as torch_nms  # noqa: E402
from detectors.postprocess import InputDetections, Thresholds, nms, postprocess  # noqa: E402
from detectors.preprocess import LetterboxGeometry  # noqa: E402

IDENTITY = LetterboxGeometry(width=640, height=640, scale=1.0, pad_x=0, pad_y=0)


def synthetic_raw(rng: np.random.Generator, images: int, classes: int = 6, anchors: int = 400):
    """Clustered boxes (so NMS has work) with sparse confident class scores."""
    raw = np.zeros((images, 4 + classes, anchors), np.float32)
    centres = rng.uniform(50, 590, size=(images, 2, anchors // 8)).repeat(8, axis=2)
    raw[:, 0:2] = centres + rng.normal(0, 6, size=(images, 2, anchors))
    raw[:, 2:4] = rng.uniform(20, 120, size=(images, 2, anchors))
    raw[:, 4:] = rng.uniform(0, 0.3, size=(images, classes, anchors)) ** 2
    hot = rng.random((images, anchors)) < 0.4
    raw[:, 4:][:, 0][hot] = rng.uniform(0.2, 0.99, size=hot.sum())
    raw[:, 4 + 1, ::5] = rng.uniform(0.3, 0.9, size=(images, len(range(0, anchors, 5))))
    return raw


def unpack(packed: torch_nms.PackedDetections) -> list[InputDetections]:
    rows, found, start = packed.rows.numpy(), [], 0
    for count in packed.counts.tolist():
        chunk = rows[start : start + count]
        found.append(InputDetections(chunk[:, :4], chunk[:, 4], chunk[:, 5].astype(np.int64)))
        start += count
    return found


@pytest.mark.parametrize(
    "thresholds",
    [
        Thresholds(),
        Thresholds(conf=0.5, iou=0.3),
        Thresholds(max_det=3),
        Thresholds(classes=(1,)),
        Thresholds(conf=0.999),  # nothing passes: empty results, right shapes
    ],
)
@pytest.mark.parametrize("fallback", [False, True])
def test_device_nms_equals_the_host_path(thresholds, fallback, monkeypatch):
    if fallback:  # the vectorised Cluster-NMS used when torchvision is missing
        monkeypatch.setattr(torch_nms, "_torchvision_batched_nms", None)
    raw = synthetic_raw(np.random.default_rng(7), images=5)
    host = postprocess(raw, [IDENTITY] * 5, thresholds)
    device = unpack(torch_nms.decode_nms(torch.from_numpy(raw), thresholds))
    assert len(device) == 5
    for want, found in zip(host, device, strict=True):
        got = found.to_original(IDENTITY)  # the host path clips to the frame too
        assert got.class_ids.tolist() == want.class_ids.tolist()
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-6)
        np.testing.assert_allclose(got.boxes, want.boxes, atol=1e-3)
    if thresholds.conf < 0.9:
        assert sum(len(d.scores) for d in device) > 10  # the case really exercises NMS


@pytest.mark.parametrize("shift", [0.0, -700.0], ids=["inside", "far-negative-corners"])
def test_an_image_never_suppresses_boxes_of_another(shift):
    raw = synthetic_raw(np.random.default_rng(3), images=1)
    raw[:, 0:2] += shift  # group offsets must keep images apart even for negative coordinates
    twice = np.concatenate([raw, raw])  # the same boxes in two images
    found = unpack(torch_nms.decode_nms(torch.from_numpy(twice), Thresholds()))
    assert len(found[0].scores) == len(found[1].scores) > 0
    np.testing.assert_array_equal(found[0].boxes, found[1].boxes)


@pytest.mark.parametrize("seed", range(5))
def test_cluster_nms_keeps_what_greedy_nms_keeps(seed):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 200, size=(300, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(10, 60, size=(300, 2))], axis=1)
    scores = rng.random(300).astype(np.float32)
    want = nms(boxes.astype(np.float32), scores, 0.45)
    got = torch_nms.cluster_nms(torch.from_numpy(boxes).float(), torch.from_numpy(scores), 0.45)
    assert got.tolist() == want.tolist()
