"""The live view: the page (``GET /``), each camera's newest detected frame, the batch stats."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, HTTPException, Response
from fastapi.responses import HTMLResponse

from pipeline.serve.control import RECENT_FRAMES
from pipeline.serve.http.handles import PipelineHandles
from pipeline.serve.http.models import CAMERA_ID, Stats
from pipeline.serve.http.security import Access

PAGE = files("pipeline.serve") / "web" / "index.html"  # package data (pyproject.toml)


def router(pipeline: PipelineHandles, access: Access) -> APIRouter:
    """The view's routes over ``pipeline``'s live frames and accounting, guarded by ``access``."""
    control, live, label, utilization = (
        pipeline.control,
        pipeline.live,
        pipeline.label,
        pipeline.utilization,
    )
    routes = APIRouter()

    @routes.get(
        "/api/cameras/{camera}/frame.jpg",
        tags=["view"],
        dependencies=access.read,
        response_class=Response,
        responses={200: {"content": {"image/jpeg": {}}}, **access.invalid},
    )
    def frame(camera: CAMERA_ID) -> Response:
        """The camera's newest detected frame (as the model saw it) with its boxes; with
        analytics, their track ids and the camera's zones and lines with running counts."""
        jpeg = live.jpeg(camera, label)
        if jpeg is None:
            raise HTTPException(404, f"no frame of {camera!r} yet")
        return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "no-store"})

    @routes.get("/api/stats", tags=["view"], dependencies=access.read, responses=access.denied)
    def stats() -> Stats:
        summary = control.accounting.summary(RECENT_FRAMES)
        return Stats(
            batch_sizes={str(size): count for size, count in summary.batch_sizes.items()},
            mean_batch_size=summary.mean_batch_size,
            detector_utilization=utilization(),
            latency_p50_s=summary.latency_p50_s,
            latency_p99_s=summary.latency_p99_s,
        )

    @routes.get("/", include_in_schema=False, dependencies=access.read)
    def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return routes
