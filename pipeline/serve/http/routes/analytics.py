"""``/api/cameras/{camera}/analytics``: a camera's zones, lines, filters and tracker, read and
changed live, with its running counts."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request

from pipeline.serve.control import CameraNotFound
from pipeline.serve.http.handles import PipelineHandles
from pipeline.serve.http.models import CAMERA_ID, AnalyticsOut, analytics_schema
from pipeline.serve.http.routes.cameras import carried_out, json_body
from pipeline.serve.http.security import Access


def router(pipeline: PipelineHandles, access: Access) -> APIRouter:
    control, cameras, live = pipeline.control, pipeline.cameras, pipeline.live
    routes = APIRouter()

    def analytics_of(camera: str) -> AnalyticsOut:
        settings = cameras.analytics(camera)
        if settings is None:
            return AnalyticsOut(settings=None, lines={}, zones={})
        counts = live.counts(camera)  # of this process's run: a line shows from its first
        lines: dict[str, dict[str, dict[str, int]]] = {}  # crossing here (the event's count)
        for (line, direction), by_label in counts.crossings.items():
            if line in settings.lines:
                lines.setdefault(line, {})[direction] = dict(by_label)
        zones = {z: by_label for z, by_label in counts.occupancy.items() if z in settings.zones}
        return AnalyticsOut(settings=settings.model_dump(mode="json"), lines=lines, zones=zones)

    @routes.get(
        "/api/cameras/{camera}/analytics",
        tags=["analytics"],
        dependencies=access.read,
        responses=access.errors,
    )
    def read_analytics(camera: CAMERA_ID) -> AnalyticsOut:
        """The camera's analytics settings and running counts (line crossings by direction
        and class, tracks in each zone by class)."""
        try:
            control.camera(camera)
        except CameraNotFound:
            raise HTTPException(404, f"no camera {camera!r}") from None
        return analytics_of(camera)

    @routes.put(
        "/api/cameras/{camera}/analytics",
        tags=["analytics"],
        dependencies=access.change,
        responses={**access.errors, **access.unsupported},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": analytics_schema()}},
            }
        },
    )
    async def change_analytics(camera: CAMERA_ID, request: Request) -> AnalyticsOut:
        """New settings (validated as the config's ``cameras[].analytics``; null: off), used
        from the camera's next frame; counts carry on, tracks too unless the tracker's
        settings changed. Pixel regions beyond the camera's frames are refused at its next
        frame (its analytics pauses, said in the log)."""
        data = await json_body(request, "JSON: the settings or null")
        if data is not None and not isinstance(data, dict):
            raise HTTPException(422, "the body must be a JSON object (the settings) or null")
        await asyncio.to_thread(carried_out, control, lambda: cameras.set_analytics(camera, data))
        return analytics_of(camera)

    return routes
