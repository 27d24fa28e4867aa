"""A camera's ``analytics`` section: what happens to its detections after the detector — filters
and masks, a tracker, zones and lines — and so which events it produces."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from pipeline.config.errors import Problem, fail, fail_at
from pipeline.config.fields import MODEL_CONFIG, Finite, key_part, resolve_path

Point = tuple[Finite, Finite]
Polygon = Annotated[list[Point], Field(min_length=3, max_length=100)]
#: Where on a box its position is taken: the ground point by default (what a painted line or a
#: floor zone is about), Frigate's and supervision's ``PolygonZone`` choice.
Anchor = Literal["bottom_center", "center", "top_center"]
ClassRef = int | str  # a class id of the model, or its label ("car")


class FilterConfig(BaseModel):
    """Which detections a camera's analytics (and its published messages) keep."""

    model_config = MODEL_CONFIG
    classes: list[ClassRef] | None = Field(
        None, min_length=1, description="Labels or class ids to keep; unset keeps all"
    )
    min_score: Finite = Field(0.0, ge=0, le=1, description="Lowest score kept")
    min_area: Finite = Field(0.0, ge=0, description="Smallest box kept, in source pixels²")
    max_area: Finite | None = Field(None, gt=0, description="Largest box kept, in source pixels²")

    @model_validator(mode="after")
    def _check_areas(self) -> FilterConfig:
        if self.max_area is not None and self.max_area < self.min_area:
            message = f"must be >= min_area ({self.min_area:g})"
            raise fail_at(type(self).__name__, [(("max_area",), message, self.max_area)])
        return self


class TrackerConfig(BaseModel):
    """ByteTrack (Roboflow's ``trackers`` package), stepped by each frame's pts."""

    model_config = MODEL_CONFIG
    kind: Literal["bytetrack"] = Field("bytetrack", description="The tracker")
    lost_track_s: Finite = Field(
        1.0, ge=0, le=60, description="Stream seconds a track lives unseen before it ends"
    )
    # Ultralytics' bytetrack.yaml values: YOLOv8n scores are lower than the detectors the
    # trackers package's own defaults (0.7 / 0.6) were tuned on, and most cars never reach 0.7
    activation_score: Finite = Field(
        0.25, ge=0, le=1, description="Score a detection needs to start a track"
    )
    high_score: Finite = Field(
        0.25, ge=0, le=1, description="Detections from here match first; lower ones second"
    )
    match_iou: Finite = Field(0.1, ge=0, le=1, description="Least IoU of a box with its track")
    confirm_frames: int = Field(
        2, ge=1, le=30, description="Frames a track is seen before it gets an id"
    )


class ZoneConfig(BaseModel):
    """A polygon: occupancy per class, entries, exits, dwell, loitering."""

    model_config = MODEL_CONFIG
    polygon: Polygon = Field(description="3-100 [x, y] points, in the camera's coordinates")
    classes: list[ClassRef] | None = Field(
        None, min_length=1, description="Classes this zone counts; unset counts all"
    )
    anchor: Anchor = Field("bottom_center", description="The point of a box that is in or out")
    inertia: int = Field(
        2, ge=1, le=30, description="Frames in a row in (or out) before an entry (or exit)"
    )
    loiter_s: Finite | None = Field(
        None, gt=0, description="A loiter event when a track stays longer than this"
    )

    @field_validator("polygon")
    @classmethod
    def _check_polygon(cls, polygon: list[Point]) -> list[Point]:
        check_polygon(polygon)
        return polygon


class LineConfig(BaseModel):
    """A directed line: crossings ``in`` (to its left, looking from start to end) and ``out``."""

    model_config = MODEL_CONFIG
    start: Point = Field(description="[x, y]")
    end: Point = Field(description="[x, y]")
    classes: list[ClassRef] | None = Field(
        None, min_length=1, description="Classes this line counts; unset counts all"
    )
    anchor: Anchor = Field("bottom_center", description="The point of a box that crosses")
    min_crossing_frames: int = Field(
        2,
        ge=1,
        le=30,
        description="Frames in a row on the new side before a crossing counts (hysteresis: "
        "a box jittering on the line is not counted again)",
    )

    @model_validator(mode="after")
    def _check_length(self) -> LineConfig:
        if self.start == self.end:
            raise fail_at(type(self).__name__, [(("end",), "a line of zero length", None)])
        return self


#: Events that may take a snapshot (a track's start and end are not what a person looks at).
SnapshotKind = Literal["zone_enter", "zone_exit", "line_cross", "loiter", "track_start"]


class SnapshotConfig(BaseModel):
    """A JPEG for each event of these kinds, of the pixels the detector saw (the model's input
    size: 640 px wide for a 16:9 camera at imgsz 640), as Frigate's come from its detect
    stream: enough to tell a person from a car and to see which way it went, not to read a
    plate."""

    model_config = MODEL_CONFIG
    kinds: list[SnapshotKind] = Field(
        ["zone_enter", "line_cross", "loiter"], min_length=1, description="Events that get one"
    )
    crop: bool = Field(False, description="The object's box with a margin, not the whole frame")
    margin: Finite = Field(0.25, ge=0, le=2, description="crop: margin each side, of box size")
    bounding_box: bool = Field(True, description="Draw the object's box on the snapshot")
    quality: int = Field(85, ge=10, le=100, description="JPEG quality")


class SnapshotStoreConfig(BaseModel):
    """Where the cameras' snapshots are kept (``snapshots:`` at the top of the config)."""

    model_config = MODEL_CONFIG
    path: Path = Field(
        Path("snapshots"),
        validate_default=True,  # the default too is relative to the config file's folder
        description="Folder, one subfolder a camera; relative to the config file's folder. "
        "Shared by every host that runs detect workers, or each keeps its own",
    )
    max_size_mb: Finite = Field(1024, gt=0, description="Oldest removed past this size")
    max_age_days: Finite = Field(10, gt=0, description="Removed past this age (Frigate's default)")

    @field_validator("path")
    @classmethod
    def _resolve(cls, path: Path, info: ValidationInfo) -> Path:
        return resolve_path(path, info)


class AnalyticsConfig(BaseModel):
    """Per camera; unset (the default) publishes the detector's boxes as they are."""

    model_config = MODEL_CONFIG
    coordinates: Literal["pixels", "normalized"] = Field(
        "pixels",
        description="Zones, lines and masks in source-frame pixels, or 0-1 of width and height",
    )
    filters: FilterConfig = Field(default_factory=FilterConfig, description="Kept detections")
    masks: list[Polygon] = Field(
        default_factory=list,
        max_length=32,
        description="Polygons where a box whose anchor falls inside is ignored",
    )
    mask_anchor: Anchor = Field("bottom_center", description="The point of a box masks test")
    tracker: TrackerConfig | None = Field(
        None, description="Track objects across frames (track_id); off unless set"
    )
    zones: dict[str, ZoneConfig] = Field(
        default_factory=dict, max_length=32, description="Zones by name"
    )
    lines: dict[str, LineConfig] = Field(
        default_factory=dict, max_length=32, description="Lines by name"
    )
    snapshots: SnapshotConfig | None = Field(
        None, description="A JPEG per event, kept in the snapshots store; off unless set"
    )

    @field_validator("zones", "lines")
    @classmethod
    def _check_names(cls, regions: dict[str, object]) -> dict[str, object]:
        for name in regions:
            key_part(name, "name", 64)  # a label of metrics, a part of MQTT topics
        return regions

    @field_validator("masks")
    @classmethod
    def _check_masks(cls, masks: list[list[Point]]) -> list[list[Point]]:
        for mask in masks:
            check_polygon(mask)
        return masks

    @model_validator(mode="after")
    def _check_regions(self) -> AnalyticsConfig:
        problems: list[Problem] = []
        if (self.zones or self.lines) and self.tracker is None:
            problems.append(
                (("tracker",), "zones and lines count tracks: set tracker (e.g. {})", None)
            )
        if self.snapshots is not None and self.tracker is None:
            problems.append(
                (("tracker",), "snapshots are of events, which need tracks: set tracker", None)
            )
        if self.coordinates == "normalized":
            for loc, point in self._points():
                if not all(0 <= v <= 1 for v in point):
                    problems.append((loc, "normalized coordinates are between 0 and 1", None))
        else:
            for loc, point in self._points():
                if any(v < 0 for v in point):
                    problems.append((loc, "pixel coordinates are >= 0", None))
            for name, line in self.lines.items():  # normalised: checked against the frames
                if 0 < math.dist(line.start, line.end) < MIN_LINE_PX:
                    problems.append((("lines", name, "end"), "shorter than one pixel", None))
            regions = [(("zones", name, "polygon"), z.polygon) for name, z in self.zones.items()]
            regions += [(("masks", index), mask) for index, mask in enumerate(self.masks)]
            for loc, polygon in regions:
                if pixel_area(polygon) < MIN_AREA_PX:
                    problems.append((loc, "covers less than one square pixel", None))
        for name in self.zones.keys() & self.lines.keys():
            problems.append(
                (("lines", name), "a zone has this name too: events tell regions by name", None)
            )
        if problems:
            raise fail_at(type(self).__name__, problems)
        return self

    def _points(self):
        for name, zone in self.zones.items():
            for index, point in enumerate(zone.polygon):
                yield ("zones", name, "polygon", index), point
        for name, line in self.lines.items():
            yield ("lines", name, "start"), line.start
            yield ("lines", name, "end"), line.end
        for index, mask in enumerate(self.masks):
            for point_index, point in enumerate(mask):
                yield ("masks", index, point_index), point


#: the least a line is long and a zone or mask covers in the frames' pixels: a region below
#: can never count anything (and a line of no length has no sides)
MIN_LINE_PX = 1.0
MIN_AREA_PX = 1.0


def pixel_area(points: Sequence[Sequence[float]]) -> float:
    """The area of a polygon drawn on whole pixels: its corners rounded, as the zones and
    masks that test boxes are."""
    corners = [(round(x), round(y)) for x, y in points]
    count = len(corners)
    twice = sum(
        corners[i][0] * corners[(i + 1) % count][1] - corners[(i + 1) % count][0] * corners[i][1]
        for i in range(count)
    )
    return abs(twice) / 2


def check_polygon(points: list[Point]) -> None:
    """A simple polygon of positive area: its edges meet only at shared corners."""
    count = len(points)
    edges = [(points[i], points[(i + 1) % count]) for i in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            if j == i + 1 or (i == 0 and j == count - 1):
                continue  # neighbours share a corner
            if _segments_cross(*edges[i], *edges[j]):
                raise fail(f"self-intersecting polygon (edges {i} and {j} cross)")
    area = sum(
        points[i][0] * points[(i + 1) % count][1] - points[(i + 1) % count][0] * points[i][1]
        for i in range(count)
    )
    if abs(area) < 1e-12:
        raise fail("a polygon of no area (its points are on one line or repeated)")


def _segments_cross(a: Point, b: Point, c: Point, d: Point) -> bool:
    def orient(p: Point, q: Point, r: Point) -> float:
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    def within(p: Point, q: Point, r: Point) -> bool:  # r on segment pq, given collinear
        return min(p[0], q[0]) <= r[0] <= max(p[0], q[0]) and min(p[1], q[1]) <= r[1] <= max(
            p[1], q[1]
        )

    o1, o2, o3, o4 = orient(a, b, c), orient(a, b, d), orient(c, d, a), orient(c, d, b)
    if o1 * o2 < 0 and o3 * o4 < 0:
        return True
    return (
        (o1 == 0 and within(a, b, c))
        or (o2 == 0 and within(a, b, d))
        or (o3 == 0 and within(c, d, a))
        or (o4 == 0 and within(c, d, b))
    )
