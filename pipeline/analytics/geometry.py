"""A camera's zones, lines and masks in its frames' pixels, and the anchor points of boxes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import supervision as sv

from pipeline.config.analytics import (
    MIN_AREA_PX,
    MIN_LINE_PX,
    AnalyticsConfig,
    Anchor,
    Point,
    pixel_area,
)

Pixel = tuple[float, float]

ANCHORS: dict[str, sv.Position] = {
    "bottom_center": sv.Position.BOTTOM_CENTER,
    "center": sv.Position.CENTER,
    "top_center": sv.Position.TOP_CENTER,
}


class RegionDoesNotFit(ValueError):
    """A zone, line or mask beyond the camera's frames, or too small to see in their pixels
    (normalised coordinates that differ by less than a pixel of these frames)."""


def anchors(detections: sv.Detections, anchor: Anchor) -> np.ndarray:
    """``(n, 2)`` points: where each box is, for a region that looks at ``anchor``."""
    return detections.get_anchors_coordinates(ANCHORS[anchor]).astype(float)


@dataclass(frozen=True)
class FrameGeometry:
    """The camera's regions in pixels of frames ``width`` × ``height``."""

    width: int
    height: int
    zones: dict[str, sv.PolygonZone]
    lines: dict[str, tuple[Pixel, Pixel]]
    masks: tuple[sv.PolygonZone, ...]

    @classmethod
    def resolve(cls, config: AnalyticsConfig, width: int, height: int, where: str) -> FrameGeometry:
        """Raises :class:`RegionDoesNotFit` naming the region (``where``: the camera's
        config path) when one lies outside the frames or is too small to see in them."""
        scale = (width, height) if config.coordinates == "normalized" else (1, 1)

        def pixels(point: Point, name: str) -> Pixel:
            x, y = point[0] * scale[0], point[1] * scale[1]
            if x > width or y > height:
                raise RegionDoesNotFit(
                    f"{where}.{name}: point [{point[0]:g}, {point[1]:g}] is outside the "
                    f"camera's {width}x{height} frames"
                )
            return x, y

        def polygon(points: list[Point], name: str) -> np.ndarray:
            drawn = [pixels(p, name) for p in points]
            area = pixel_area(drawn)
            if area < MIN_AREA_PX:
                raise RegionDoesNotFit(
                    f"{where}.{name}: covers {area:g} square pixels of the camera's "
                    f"{width}x{height} frames (at least {MIN_AREA_PX:g})"
                )
            return np.array(drawn).round().astype(int)

        def line(start: Point, end: Point, name: str) -> tuple[Pixel, Pixel]:
            ends = pixels(start, name), pixels(end, name)
            length = float(np.hypot(ends[1][0] - ends[0][0], ends[1][1] - ends[0][1]))
            if not length >= MIN_LINE_PX:
                raise RegionDoesNotFit(
                    f"{where}.{name}: {length:g} pixels long in the camera's {width}x{height} "
                    f"frames (at least {MIN_LINE_PX:g})"
                )
            return ends

        zones = {
            name: sv.PolygonZone(
                polygon(zone.polygon, f"zones.{name}"),
                triggering_anchors=(ANCHORS[zone.anchor],),
            )
            for name, zone in config.zones.items()
        }
        lines = {
            name: line(drawn.start, drawn.end, f"lines.{name}")
            for name, drawn in config.lines.items()
        }
        masks = tuple(
            sv.PolygonZone(
                polygon(mask, f"masks[{index}]"),
                triggering_anchors=(ANCHORS[config.mask_anchor],),
            )
            for index, mask in enumerate(config.masks)
        )
        return cls(width, height, zones, lines, masks)
