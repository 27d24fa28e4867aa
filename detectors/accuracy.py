"""How far one detector's boxes are from another's on the same frames: greedy one-to-one
matching by class and IoU (INT8 against FP16 engines, padded against own-shape batches)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detectors.postprocess import ImageDetections


@dataclass(frozen=True)
class Int8AccuracyReport:
    """How far an INT8 engine's detections are from the FP16 engine's on the same frames."""

    images: int
    reference_boxes: int  # FP16 detections
    candidate_boxes: int  # INT8 detections
    matched: int  # pairs with IoU >= iou_threshold and the same class
    mean_score_drop: float  # FP16 score - INT8 score over matched pairs (> 0: INT8 less sure)
    max_score_drop: float
    iou_threshold: float = 0.5
    reference: str = "fp16"
    candidate: str = "int8"

    @property
    def match_rate(self) -> float:
        """Share of the FP16 boxes the INT8 engine reproduces (1.0 when there were none)."""
        if self.reference_boxes == 0:
            return 1.0 if self.candidate_boxes == 0 else 0.0
        return self.matched / self.reference_boxes

    @property
    def extra_boxes(self) -> int:
        """INT8 boxes with no FP16 counterpart."""
        return self.candidate_boxes - self.matched

    def to_markdown(self) -> str:
        rows = [
            ("frames", f"{self.images}"),
            (f"{self.reference} boxes", f"{self.reference_boxes}"),
            (f"{self.candidate} boxes", f"{self.candidate_boxes}"),
            (f"matched (IoU ≥ {self.iou_threshold:g}, same class)", f"{self.matched}"),
            ("match rate", f"{self.match_rate:.1%}"),
            (f"{self.candidate} boxes without a match", f"{self.extra_boxes}"),
            ("mean score drop", f"{self.mean_score_drop:+.4f}"),
            ("max score drop", f"{self.max_score_drop:+.4f}"),
        ]
        lines = [f"| {self.candidate} vs {self.reference} | value |", "|---|---:|"]
        return "\n".join(lines + [f"| {name} | {value} |" for name, value in rows]) + "\n"


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    width = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    height = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = width * height
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / ((box[2] - box[0]) * (box[3] - box[1]) + areas - inter + 1e-9)


def compare_detections(
    reference: Sequence[ImageDetections],
    candidate: Sequence[ImageDetections],
    *,
    iou_threshold: float = 0.5,
    names: tuple[str, str] = ("fp16", "int8"),
) -> Int8AccuracyReport:
    """Greedy one-to-one matching per image, highest reference score first."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference images but {len(candidate)} candidates")
    drops: list[float] = []
    for ref, cand in zip(reference, candidate, strict=True):
        free = np.ones(len(cand), dtype=bool)
        for i in np.argsort(-ref.scores, kind="stable"):
            eligible = free & (cand.class_ids == ref.class_ids[i])
            if not eligible.any():
                continue
            ious = np.where(eligible, _iou(ref.boxes[i], cand.boxes), -1.0)
            best = int(np.argmax(ious))
            if ious[best] >= iou_threshold:
                free[best] = False
                drops.append(float(ref.scores[i] - cand.scores[best]))
    return Int8AccuracyReport(
        images=len(reference),
        reference_boxes=sum(len(r) for r in reference),
        candidate_boxes=sum(len(c) for c in candidate),
        matched=len(drops),
        mean_score_drop=float(np.mean(drops)) if drops else 0.0,
        max_score_drop=float(np.max(drops)) if drops else 0.0,
        iou_threshold=iou_threshold,
        reference=names[0],
        candidate=names[1],
    )
