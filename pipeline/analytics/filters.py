"""Per-camera filters and object masks: which of the detector's boxes a camera keeps (before
tracking, as Frigate's ``objects.filters`` and masks)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import supervision as sv

from pipeline.config.analytics import ClassRef, FilterConfig
from pipeline.errors import BadInput


def class_ids(
    refs: Sequence[ClassRef] | None, label: Callable[[int], str], classes: int, where: str
) -> frozenset[int] | None:
    """Class ids for labels or ids as the config gives them (``None``: every class); an unknown
    one is bad input that names ``where`` and what the model knows."""
    if refs is None:
        return None
    by_label = {label(i): i for i in range(classes)}
    ids = set()
    for index, ref in enumerate(refs):
        if isinstance(ref, int):
            if not 0 <= ref < classes:
                raise BadInput(
                    f"{where}[{index}]: class id {ref} not in the model (0-{classes - 1})"
                )
            ids.add(ref)
        elif ref in by_label:
            ids.add(by_label[ref])
        else:
            known = ", ".join(list(by_label)[:12])
            raise BadInput(
                f"{where}[{index}]: the model has no class {ref[:40]!r} (it knows {known}, ...)"
            )
    return frozenset(ids)


class ObjectFilter:
    """Keeps what passes the camera's filters and no mask covers."""

    def __init__(self, config: FilterConfig, classes: frozenset[int] | None):
        self._config = config
        self._classes = classes

    def keep(self, detections: sv.Detections, masks: Sequence[sv.PolygonZone]) -> np.ndarray:
        """A boolean array: which detections are kept."""
        config = self._config
        kept = detections.confidence >= config.min_score
        if self._classes is not None:
            kept &= np.isin(detections.class_id, list(self._classes))
        if config.min_area > 0 or config.max_area is not None:
            area = detections.box_area
            kept &= area >= config.min_area
            if config.max_area is not None:
                kept &= area <= config.max_area
        for mask in masks:
            if len(detections):
                kept &= ~mask.trigger(detections)
        return kept
