"""A camera's zones, lines and masks in its frames' pixels, and the anchor points of boxes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import supervision as sv

from pipeline.config.analytics import AnalyticsConfig, Anchor, Point

ANCHORS: dict[str, sv.Position] = {
    "bottom_center": sv.Position.BOTTOM_CENTER,
    "center": sv.Position.CENTER,
    "top_center": sv.Position.TOP_CENTER,
}


class RegionOutsideFrame(ValueError):
    """A zone, line or mask in pixels beyond the camera's frames."""


def anchors(detections: sv.Detections, anchor: Anchor) -> np.ndarray:
    """``(n, 2)`` points: where each box is, for a region that looks at ``anchor``."""
    return detections.get_anchors_coordinates(ANCHORS[anchor]).astype(float)


@dataclass(frozen=True)
class FrameGeometry:
    """The camera's regions in pixels of frames ``width`` × ``height``."""

    width: int
    height: int
    zones: dict[str, sv.PolygonZone]
    lines: dict[str, tuple[tuple[float, float], tuple[float, float]]]
    masks: tuple[sv.PolygonZone, ...]

    @classmethod
    def resolve(cls, config: AnalyticsConfig, width: int, height: int, where: str) -> FrameGeometry:
        """Raises :class:`RegionOutsideFrame` naming the region (``where``: the camera's
        config path) when one lies outside the frames."""
        scale = (width, height) if config.coordinates == "normalized" else (1, 1)

        def pixels(point: Point, name: str) -> tuple[float, float]:
            x, y = point[0] * scale[0], point[1] * scale[1]
            if x > width or y > height:
                raise RegionOutsideFrame(
                    f"{where}.{name}: point [{point[0]:g}, {point[1]:g}] is outside the "
                    f"camera's {width}x{height} frames"
                )
            return x, y

        def polygon(points: list[Point], name: str) -> np.ndarray:
            return np.array([pixels(p, name) for p in points]).round().astype(int)

        zones = {
            name: sv.PolygonZone(
                polygon(zone.polygon, f"zones.{name}"),
                triggering_anchors=(ANCHORS[zone.anchor],),
            )
            for name, zone in config.zones.items()
        }
        lines = {
            name: (pixels(line.start, f"lines.{name}"), pixels(line.end, f"lines.{name}"))
            for name, line in config.lines.items()
        }
        masks = tuple(
            sv.PolygonZone(
                polygon(mask, f"masks[{index}]"),
                triggering_anchors=(ANCHORS[config.mask_anchor],),
            )
            for index, mask in enumerate(config.masks)
        )
        return cls(width, height, zones, lines, masks)
