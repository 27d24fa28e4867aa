"""Box matching for parity checks: same class and IoU above a floor, one-to-one."""

from __future__ import annotations

from collections.abc import Sequence

Box = tuple[float, float, float, float]
Labeled = tuple[Box, int]  # (x1, y1, x2, y2), class id


def iou(a: Box, b: Box) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else float(a == b)


def unmatched(
    expected: Sequence[Labeled], actual: Sequence[Labeled], min_iou: float = 0.99
) -> list[str]:
    """Expected boxes without a same-class partner of IoU >= ``min_iou``, then extra boxes."""
    free = list(actual)
    problems = []
    for box, class_id in expected:
        candidates = [
            (iou(box, other), i) for i, (other, cls) in enumerate(free) if cls == class_id
        ]
        best = max(candidates, default=(0.0, -1))
        if best[0] >= min_iou:
            free.pop(best[1])
        else:
            problems.append(f"missing class {class_id} {box} (best IoU {best[0]:.3f})")
    problems += [f"extra class {cls} {box}" for box, cls in free]
    return problems
