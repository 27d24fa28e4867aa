"""``build_app``: the FastAPI app of the endpoint, assembled from the routers of
:mod:`pipeline.serve.http.routes`, with errors answered as ``Problem`` bodies, every request
body capped (:mod:`.limits`) and the API's browser (``/docs``, ``/redoc``) served from this
process: fastapi-offline ships Swagger UI and ReDoc, so the pages work without the internet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry

from pipeline.config.errors import MAX_LINE, clip
from pipeline.serve.control import Control
from pipeline.serve.events import EventLog
from pipeline.serve.http.handles import CameraOps, PipelineHandles
from pipeline.serve.http.limits import MAX_BODY_BYTES, BodyLimit
from pipeline.serve.http.routes import analytics as analytics_routes
from pipeline.serve.http.routes import cameras as camera_routes
from pipeline.serve.http.routes import decoders as decoder_routes
from pipeline.serve.http.routes import events as event_routes
from pipeline.serve.http.routes import health, metrics, view
from pipeline.serve.http.security import access_for
from pipeline.serve.live_view import LiveFrames

DOCS_ASSETS = "/docs-assets"  # Swagger UI's and ReDoc's scripts and styles


def build_app(
    *,
    control: Control,
    cameras: CameraOps | None,
    registry: CollectorRegistry,
    live: LiveFrames,
    utilization: Callable[[], float],
    label: Callable[[int], str] = str,
    token: str | None = None,
    events: EventLog | None = None,
    decoders: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """The endpoint over a running pipeline's objects; with ``token``, the API and the view
    need it as a bearer token, without one they take only loopback ``Host`` headers.
    ``cameras`` None: metrics and health only (``framebatch decode``: no detections to show,
    no camera API).  ``events``: the analytics events and snapshots ``/api/events`` serves.
    ``decoders``: a decode worker's placement, which ``/api/decoders`` serves."""
    app = FastAPIOffline(  # /docs and /redoc with their scripts served here, not from a CDN
        title="framebatch",
        summary="Metrics, health, cameras and live view of a running framebatch pipeline",
        version="1",
        static_url=DOCS_ASSETS,
    )
    app.include_router(metrics.router(registry))
    app.include_router(health.router(control))
    if decoders is not None:
        app.include_router(decoder_routes.router(decoders, access_for(token)))
    if cameras is not None:
        pipeline = PipelineHandles(
            control=control,
            cameras=cameras,
            registry=registry,
            live=live,
            utilization=utilization,
            label=label,
        )
        access = access_for(token)
        app.include_router(camera_routes.router(pipeline, access))
        app.include_router(analytics_routes.router(pipeline, access))
        app.include_router(view.router(pipeline, access))
        if events is not None:
            app.include_router(event_routes.router(events, access))
    app.add_exception_handler(HTTPException, problem)
    app.add_exception_handler(RequestValidationError, unprocessable)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    return app


def problem(_request: Request, exc: HTTPException) -> JSONResponse:
    """An ``HTTPException`` as a ``Problem`` body, with its headers (``WWW-Authenticate``)."""
    return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)


def unprocessable(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """A request FastAPI could not validate: 422 with ``validation_problems`` as the detail."""
    return JSONResponse({"detail": validation_problems(exc)}, 422)


def validation_problems(exc: RequestValidationError) -> list[str]:
    """FastAPI's validation errors as ``field: message`` lines, as for a config (``Problem``);
    the values sent are not echoed."""
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        where = ".".join(loc[1:] if loc and loc[0] in ("path", "query", "body") else loc)
        lines.append(clip(f"{where or 'body'}: {error.get('msg', 'invalid')}", MAX_LINE))
    return lines
