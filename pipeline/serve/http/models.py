"""The API's request and response models, and the camera as a request body's JSON Schema."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from pipeline.config import CameraConfig
from pipeline.config.analytics import AnalyticsConfig
from streams.object_events import ObjectEvent

CAMERA_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
CAMERA_ID = Annotated[str, PathParam(pattern=CAMERA_ID_PATTERN, max_length=64)]


class CameraOut(BaseModel):
    id: str
    url: str = Field(description="The source, password redacted")
    state: str = Field(
        description="starting, running, reconnecting, ended, failed, draining, removed"
    )
    priority: int
    live: bool = Field(
        description="A live camera: a network stream (rtsp://) that never ends and sheds the "
        "frames it sends faster than they are detected; false for a video file"
    )
    realtime: bool = Field(
        description="Frames come at the source's own pace: a live camera, or a file replayed "
        "in real time (realtime: true, as the demo's cameras); false for a file read as fast "
        "as the detector takes it"
    )
    decoded: int
    processed: int
    dropped: dict[str, int] = Field(description="Frames without detections, by cause")
    fps: float = Field(description="Frames processed a second, last few seconds")
    latency_p50_s: float | None
    latency_p99_s: float | None


class EventOut(BaseModel):
    """An analytics event, as ``framebatch consume --events`` prints it."""

    id: str = Field(description="<frame_id>:<n>; the same when a frame is analysed again")
    kind: str
    camera: str
    frame_id: str
    pts: float | None
    time: float = Field(description="Capture time of the frame, epoch seconds")
    track_id: int
    class_id: int
    label: str
    score: float
    box: list[float] = Field(description="x1, y1, x2, y2 in source-frame pixels")
    region: str | None = Field(description="The zone or line")
    direction: str | None = Field(description="line_cross: in or out")
    dwell_s: float | None
    count: int | None = Field(description="The line's or zone's running count of the class")
    snapshot: str | None = Field(description="Path in the snapshots folder")
    snapshot_url: str | None = Field(description="Where this API serves the snapshot")
    schema_version: int = Field(alias="schema")

    @classmethod
    def of(cls, event: ObjectEvent) -> EventOut:
        data = event.to_json()
        url = f"/api/events/{event.id}/snapshot.jpg" if event.snapshot else None
        return cls.model_validate({**data, "snapshot_url": url})


class PriorityIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: int = Field(strict=True, ge=0, le=9, description="0 is served first and shed last")


class Problem(BaseModel):
    detail: str | list[str]


class Stats(BaseModel):
    batch_sizes: dict[str, int] = Field(description="Batches dispatched, by size")
    mean_batch_size: float
    detector_utilization: float
    latency_p50_s: float | None
    latency_p99_s: float | None


def camera_schema() -> dict[str, Any]:
    """A config's camera as JSON Schema, with the id's form (checked by a validator, so absent
    from the model's own schema) spelt out for clients."""
    schema = inline_definitions(CameraConfig.model_json_schema())
    schema["properties"]["id"].update(minLength=1, maxLength=64, pattern=CAMERA_ID_PATTERN)
    schema["properties"]["url"].update(minLength=1)
    return schema


class AnalyticsOut(BaseModel):
    """A camera's analytics settings and its running counts."""

    settings: dict[str, Any] | None = Field(
        description="As the config's cameras[].analytics; null: off"
    )
    lines: dict[str, dict[str, dict[str, int]]] = Field(
        description="line -> in/out -> label -> crossings so far"
    )
    zones: dict[str, dict[str, int]] = Field(description="zone -> label -> tracks in it now")


def analytics_schema() -> dict[str, Any]:
    """A camera's ``analytics`` as JSON Schema (a request body), or null for off."""
    return {"anyOf": [inline_definitions(AnalyticsConfig.model_json_schema()), {"type": "null"}]}


def inline_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each ``$ref`` to its own ``$defs`` replaced by the definition: a request
    body's schema sits inside the OpenAPI document, where ``#/$defs/...`` points at nothing
    (clients and schemathesis could not resolve the camera's ``analytics``). The config models
    are not recursive, so the result is finite."""
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                siblings = {key: resolve(value) for key, value in node.items() if key != "$ref"}
                return {**resolve(definitions[ref.removeprefix("#/$defs/")]), **siblings}
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)
