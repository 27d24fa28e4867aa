"""YOLOv8 output decode, class-aware NMS and mapping of boxes back to original pixels.

The raw output is ``(N, 4 + classes, anchors)``: rows 0-3 are cx, cy, w, h in input pixels and
the rest are per-class scores (sigmoid already applied).  Each anchor's best score is taken for
the whole batch at once (a max, the confidence pre-filter), its class only for the anchors past
the threshold; NMS then runs per image, as in Ultralytics' ``non_max_suppression``
(``multi_label=False``, class offsets of ``max_wh`` so boxes of different classes never suppress
each other).  Nothing here depends on the batch: an image gives the same boxes alone or in a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detectors.preprocess import LetterboxGeometry

MAX_WH = 7680  # class offset for class-aware NMS, as in Ultralytics
MAX_NMS = 30000  # candidates kept for NMS, highest scores first


@dataclass(frozen=True)
class Thresholds:
    """Post-processing settings (Ultralytics' names and defaults)."""

    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    classes: tuple[int, ...] | None = None


@dataclass(frozen=True, eq=False)
class ImageDetections:
    """Detections of one image: ``boxes`` (K, 4) xyxy in original pixels, sorted by score."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)


@dataclass(frozen=True, eq=False)
class InputDetections:
    """Detections of one image after NMS, still in model-input pixels (what a device returns)."""

    boxes: np.ndarray  # (K, 4) float32 xyxy
    scores: np.ndarray  # (K,) float32
    class_ids: np.ndarray  # (K,) int64

    def to_original(self, geometry: LetterboxGeometry) -> ImageDetections:
        """Undo the letterbox: boxes in the original frame's pixels, clipped to it."""
        return ImageDetections(_to_original(self.boxes, geometry), self.scores, self.class_ids)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy NMS: indices of kept boxes, highest score first (like ``torchvision.ops.nms``)."""
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1) * (y2 - y1)
    keep: list[int] = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(int(best))
        width = np.clip(np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]), 0, None)
        height = np.clip(np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]), 0, None)
        inter = width * height
        iou = inter / (areas[best] + areas[rest] - inter + 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def _to_original(boxes: np.ndarray, geometry: LetterboxGeometry) -> np.ndarray:
    pad = np.array([geometry.pad_x, geometry.pad_y, geometry.pad_x, geometry.pad_y], np.float32)
    boxes = (boxes.astype(np.float32, copy=False) - pad) / np.float32(geometry.scale)
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, geometry.width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, geometry.height)
    return boxes


def _one_image(
    pred: np.ndarray,
    scores: np.ndarray,
    geometry: LetterboxGeometry,
    thresholds: Thresholds,
) -> ImageDetections:
    candidates = np.flatnonzero(scores > thresholds.conf)
    # the class of the few anchors past the threshold only: an argmax over all 80 x anchors
    # costs ~0.5 ms an image (numpy copies the axis last), the max above 0.07
    class_ids = pred[4:, candidates].argmax(axis=0)
    if thresholds.classes is not None:
        wanted = np.isin(class_ids, thresholds.classes)
        candidates, class_ids = candidates[wanted], class_ids[wanted]
    if candidates.size > MAX_NMS:
        order = np.argsort(-scores[candidates], kind="stable")[:MAX_NMS]
        candidates, class_ids = candidates[order], class_ids[order]
    cx, cy, w, h = pred[:4, candidates]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    cand_scores, cand_classes = scores[candidates], class_ids
    keep = nms(boxes + cand_classes[:, None] * MAX_WH, cand_scores, thresholds.iou)
    keep = keep[: thresholds.max_det]
    return ImageDetections(
        boxes=_to_original(boxes[keep], geometry),
        scores=cand_scores[keep],
        class_ids=cand_classes[keep],
    )


def postprocess(
    raw: np.ndarray, geometries: Sequence[LetterboxGeometry], thresholds: Thresholds
) -> list[ImageDetections]:
    """Decode a batch of raw YOLOv8 outputs into per-image detections in original pixels."""
    if raw.ndim != 3 or raw.shape[0] != len(geometries):
        raise ValueError(
            f"expected output (N, 4+classes, anchors) for {len(geometries)} images, got {raw.shape}"
        )
    scores = raw[:, 4:, :].max(axis=1)  # each anchor's best class score: the pre-filter
    return [
        _one_image(raw[i], scores[i], geometries[i], thresholds) for i in range(len(geometries))
    ]
