"""YOLOv8 decode + class-aware NMS for a whole batch on the model's device (torch).

Same rules as :mod:`detectors.postprocess` (best class per anchor, ``conf`` filter, class
filter, at most ``MAX_NMS`` candidates per image, class-aware NMS, ``max_det`` per image), but
one NMS call covers every image of the batch: boxes are grouped by (image, class), so nothing
in one image can suppress a box in another. ``torchvision.ops.batched_nms`` does the NMS when
torchvision is installed; otherwise :func:`cluster_nms`, an exact vectorised equivalent.

Only the kept boxes leave the device: one packed ``(K, 6)`` tensor and per-image counts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from detectors.postprocess import MAX_NMS, Thresholds

try:  # optional: the fastest NMS kernels (CUDA and CPU)
    from torchvision.ops import batched_nms as _torchvision_batched_nms
except ImportError:  # pragma: no cover - exercised where torchvision is absent
    _torchvision_batched_nms = None


@dataclass(frozen=True)
class PackedDetections:
    """Kept boxes of a batch, grouped by image: rows ``x1 y1 x2 y2 score class`` (input pixels)."""

    rows: torch.Tensor  # (K, 6) float32, image 0's rows first, each image's by falling score
    counts: torch.Tensor  # (N,) int64: rows per image


def _box_iou(boxes: torch.Tensor) -> torch.Tensor:
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    top_left = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    bottom_right = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(dim=2)
    return inter / (area[:, None] + area[None, :] - inter)


def cluster_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS as matrix iterations (Cluster-NMS, Zheng et al. 2020): the same boxes as greedy
    NMS, without a per-box loop. Indices kept, highest score first. Memory is K², so it is the
    fallback for torchvision's kernel, not the default."""
    order = scores.argsort(descending=True, stable=True)
    iou = _box_iou(boxes[order]).triu_(diagonal=1)
    suppressing = iou
    for _ in range(len(order)):  # converges in a few rounds; K rounds is the proven bound
        kept = suppressing.amax(dim=0) <= iou_threshold
        updated = iou * kept[:, None]  # only boxes still kept may suppress others
        if torch.equal(updated, suppressing):
            break
        suppressing = updated
    return order[suppressing.amax(dim=0) <= iou_threshold]


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """NMS within each group; indices kept, highest score first.

    Groups are kept apart by offsetting their boxes, which needs every coordinate >= 0 (so the
    boxes are shifted first; IoU does not change) and float64 (thousands of groups push the
    offsets past float32's pixel precision; the host path computes in float64 too)."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    boxes = (boxes - boxes.min()).double()
    if _torchvision_batched_nms is not None:
        return _torchvision_batched_nms(boxes, scores.double(), groups, iou_threshold)
    offsets = groups.to(boxes.dtype)[:, None] * (boxes.max() + 1)
    return cluster_nms(boxes + offsets, scores, iou_threshold)


@functools.lru_cache(maxsize=8)
def _class_filter(classes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The wanted class ids on the device, made once (a host-to-device copy per batch else)."""
    return torch.tensor(classes, device=device)


def _per_image(image_index: torch.Tensor, images: int) -> torch.Tensor:
    """How many entries each image has, computed on the device without waiting for it
    (``torch.bincount`` on CUDA reads the largest index back to the host first)."""
    counts = torch.zeros(images, dtype=torch.int64, device=image_index.device)
    return counts.index_add_(0, image_index, torch.ones_like(image_index))


def _first_per_image(image_index: torch.Tensor, limit: int, images: int) -> torch.Tensor:
    """Mask of the first ``limit`` entries of each image (``image_index`` sorted ascending)."""
    counts = _per_image(image_index, images)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(image_index), device=image_index.device) - starts[image_index]
    return rank < limit


def _by_image(image_index: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Order grouping entries by image, each image's by falling score (stable)."""
    by_score = scores.argsort(descending=True, stable=True)
    return by_score[image_index[by_score].argsort(stable=True)]


def decode_nms(raw: torch.Tensor, thresholds: Thresholds) -> PackedDetections:
    """Raw ``(N, 4 + classes, anchors)`` output -> kept boxes of every image, on its device."""
    raw = raw.float()
    images, rows, _ = raw.shape
    scores, class_ids = raw[:, 4:, :].max(dim=1)  # (N, A)
    candidates = scores > thresholds.conf
    if thresholds.classes is not None:
        candidates &= torch.isin(class_ids, _class_filter(thresholds.classes, raw.device))
    image_index, anchor = candidates.nonzero(as_tuple=True)
    cand_scores = scores[image_index, anchor]
    order = _by_image(image_index, cand_scores)
    order = order[_first_per_image(image_index[order], MAX_NMS, images)]
    image_index, anchor, cand_scores = image_index[order], anchor[order], cand_scores[order]
    cand_classes = class_ids[image_index, anchor]
    cx, cy, w, h = raw[image_index, :4, anchor].unbind(1)
    boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=1)
    keep = batched_nms(boxes, cand_scores, image_index * (rows - 4) + cand_classes, thresholds.iou)
    keep = keep[_by_image(image_index[keep], cand_scores[keep])]
    keep = keep[_first_per_image(image_index[keep], thresholds.max_det, images)]
    packed = torch.cat(
        [boxes[keep], cand_scores[keep, None], cand_classes[keep, None].to(boxes.dtype)], dim=1
    )
    return PackedDetections(packed, _per_image(image_index[keep], images))
