"""``/api/events``: the cameras' latest analytics events and their snapshots."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import Response

from pipeline.serve.events import EventLog
from pipeline.serve.http.models import CAMERA_ID_PATTERN, EventOut
from pipeline.serve.http.security import Access
from streams.object_events import EventKind

EVENT_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,200}$"


def router(events: EventLog, access: Access) -> APIRouter:
    routes = APIRouter()

    @routes.get("/api/events", tags=["events"], dependencies=access.read, responses=access.invalid)
    def latest_events(
        camera: Annotated[
            str | None, Query(pattern=CAMERA_ID_PATTERN, description="One camera's only")
        ] = None,
        kind: Annotated[EventKind | None, Query(description="One kind's only")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        per_camera: Annotated[
            int | None, Query(ge=1, le=50, description="At most this many of each camera")
        ] = None,
    ) -> list[EventOut]:
        """The latest events, newest first; each names its snapshot when it has one."""
        return [
            EventOut.of(event)
            for event in events.latest(camera=camera, kind=kind, limit=limit, per_camera=per_camera)
        ]

    @routes.get(
        "/api/events/{event_id}/snapshot.jpg",
        tags=["events"],
        dependencies=access.read,
        response_class=Response,
        responses={200: {"content": {"image/jpeg": {}}}, **access.invalid},
    )
    def snapshot(
        event_id: Annotated[str, PathParam(pattern=EVENT_ID_PATTERN, max_length=200)],
    ) -> Response:
        """The event's snapshot (the frame the detector saw, or the object's crop)."""
        jpeg = events.snapshot(event_id)
        if jpeg is None:
            raise HTTPException(
                404, f"no snapshot of event {event_id!r} here (none taken, or swept by its caps)"
            )
        return Response(jpeg, media_type="image/jpeg")

    return routes
