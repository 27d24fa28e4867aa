"""The daemon's HTTP endpoint on ``http.listen``: metrics, health, the camera API, the live view.

* ``GET /metrics``: Prometheus text format (``pipeline.serve.metrics``);
* ``GET /healthz``: 200 while the supervisor ticks (liveness; a batch worker that dies ends
  the run);
  ``GET /readyz``: 200 once the model is loaded and warm and Redis answers (readiness);
* ``/api/cameras``: list, add (validated as a config's camera), change priority, remove
  (the camera drains: its frames are all processed or counted); OpenAPI at ``/openapi.json``;
* ``GET /``: the live view (``pipeline/serve/web/index.html``), frames at
  ``/api/cameras/{id}/frame.jpg``.

With ``http.token`` set, the API and the view need ``Authorization: Bearer <token>`` (the page
takes it as ``?token=``); without one (loopback only) they take only loopback ``Host`` headers,
and changes only as ``application/json``. ``/metrics`` and the probes stay open, as Prometheus
and Kubernetes expect. The server (uvicorn) runs on its own thread; every change to the
pipeline is carried out by the supervisor's thread (``pipeline.serve.control``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Protocol

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from pipeline.config import CameraConfig, ConfigError, split_listen
from pipeline.config.errors import MAX_LINE, clip
from pipeline.serve.control import (
    RECENT_FRAMES,
    CameraConflict,
    CameraNotFound,
    CameraView,
    Control,
)
from pipeline.serve.live_view import LiveFrames

log = logging.getLogger(__name__)

PAGE = Path(__file__).with_name("web") / "index.html"
CAMERA_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
CAMERA_ID = Annotated[str, PathParam(pattern=CAMERA_ID_PATTERN, max_length=64)]
SERVER_STOP_S = 5.0
MAX_BODY_BYTES = 64 * 1024
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
BearerCredentials = Annotated[
    HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))
]


class CameraOps(Protocol):
    """The changes the pipeline makes on its supervisor's thread."""

    def add_camera(self, data: dict[str, Any]) -> CameraView: ...

    def remove_camera(self, camera: str) -> CameraView: ...

    def set_priority(self, camera: str, priority: int) -> CameraView: ...


class CameraOut(BaseModel):
    id: str
    url: str = Field(description="The source, password redacted")
    state: str = Field(
        description="starting, running, reconnecting, ended, failed, draining, removed"
    )
    priority: int
    live: bool
    decoded: int
    processed: int
    dropped: dict[str, int] = Field(description="Frames without detections, by cause")
    fps: float = Field(description="Frames processed a second, last few seconds")
    latency_p50_s: float | None
    latency_p99_s: float | None


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
    schema = CameraConfig.model_json_schema()
    schema["properties"]["id"].update(minLength=1, maxLength=64, pattern=CAMERA_ID_PATTERN)
    schema["properties"]["url"].update(minLength=1)
    return schema


def validation_problems(exc: RequestValidationError) -> list[str]:
    """FastAPI's validation errors as ``field: message`` lines, as for a config (``Problem``);
    the values sent are not echoed."""
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        where = ".".join(loc[1:] if loc and loc[0] in ("path", "query", "body") else loc)
        lines.append(clip(f"{where or 'body'}: {error.get('msg', 'invalid')}", MAX_LINE))
    return lines


def build_app(
    *,
    control: Control,
    cameras: CameraOps,
    registry: CollectorRegistry,
    live: LiveFrames,
    utilization: Callable[[], float],
    label: Callable[[int], str] = str,
    token: str | None = None,
) -> FastAPI:
    app = FastAPI(
        title="framebatch",
        summary="Metrics, health, cameras and live view of a running framebatch pipeline",
        version="1",
    )

    def authorised(request: Request, credentials: BearerCredentials) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials else request.query_params.get("token", "")
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "a bearer token is required", {"WWW-Authenticate": "Bearer"})

    def loopback_host(request: Request) -> None:
        """Without a token the server listens on loopback only; a request naming another host
        is a web page's (DNS rebinding), not a local client's."""
        if host_name(request.headers.get("host", "")) not in LOOPBACK_NAMES:
            raise HTTPException(
                403, "the Host header must name this machine (127.0.0.1, localhost)"
            )

    def json_content(request: Request) -> None:
        """Changes take JSON only: a form or text/plain body is what a cross-site page can send
        without asking the browser first."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise HTTPException(415, "send the body as application/json")

    # with a token: the bearer token; without (loopback only): a loopback Host header
    guarded = [Depends(authorised)] if token is not None else [Depends(loopback_host)]
    changes = [*guarded, Depends(json_content)]
    denied: dict[int | str, dict[str, Any]] = (
        {401: {"model": Problem}} if token is not None else {403: {"model": Problem}}
    )
    invalid = {**denied, 404: {"model": Problem}, 422: {"model": Problem}}
    errors = {**invalid, 409: {"model": Problem}}
    unsupported = {415: {"model": Problem}, 413: {"model": Problem}}

    def out(view: CameraView) -> CameraOut:
        return CameraOut(**asdict(view))

    def run(apply: Callable[[], CameraView]) -> CameraOut:
        """A change on the supervisor's thread; its errors as HTTP statuses."""
        try:
            return out(control.submit(apply))
        except CameraNotFound as exc:
            raise HTTPException(404, f"no camera {exc.args[0]!r}") from None
        except CameraConflict as exc:
            raise HTTPException(409, str(exc)) from None
        except ConfigError as exc:  # one ``field: message`` line per problem
            raise HTTPException(422, exc.errors) from None
        except TimeoutError:
            raise HTTPException(503, "the pipeline did not answer in time") from None

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"], responses={503: {"model": Problem}})
    def healthz() -> dict[str, str]:
        """Liveness: the supervisor ticks (it waits out a Redis outage within its
        reconnect timeout; a dead batch worker ends the run)."""
        if not control.alive():
            raise HTTPException(503, "the supervisor has stopped ticking")
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"model": Problem}})
    def readyz() -> dict[str, str]:
        """Readiness: the model is loaded and warm, the batchers run, Redis answers."""
        problems = []
        if not control.ready.is_set():
            problems.append("the model is loading or warming up")
        if not control.redis_reachable():
            problems.append("Redis does not answer")
        if problems:
            raise HTTPException(503, problems)
        return {"status": "ready"}

    @app.get("/api/cameras", tags=["cameras"], dependencies=guarded, responses=denied)
    def list_cameras() -> list[CameraOut]:
        return [out(view) for view in control.cameras()]

    @app.post(
        "/api/cameras",
        tags=["cameras"],
        status_code=201,
        dependencies=changes,
        responses={**errors, **unsupported},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": camera_schema()}},
            }
        },
    )
    async def add_camera(request: Request) -> CameraOut:
        """Add a camera without a restart; validated as a config's ``cameras`` entry (relative
        file paths are relative to the config file)."""
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise HTTPException(413, f"a camera is under {MAX_BODY_BYTES // 1024} KiB of JSON")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
            raise HTTPException(422, "the body must be a JSON object") from None
        if not isinstance(data, dict):
            raise HTTPException(422, "the body must be a JSON object (a camera)")
        return await asyncio.to_thread(run, lambda: cameras.add_camera(data))

    @app.get("/api/cameras/{camera}", tags=["cameras"], dependencies=guarded, responses=errors)
    def get_camera(camera: CAMERA_ID) -> CameraOut:
        try:
            return out(control.camera(camera))
        except CameraNotFound:
            raise HTTPException(404, f"no camera {camera!r}") from None

    @app.patch(
        "/api/cameras/{camera}",
        tags=["cameras"],
        dependencies=changes,
        responses={
            **errors,
            **unsupported,
            400: {"model": Problem, "description": "The body is not JSON"},
        },
    )
    def set_priority(camera: CAMERA_ID, change: PriorityIn) -> CameraOut:
        """Change a camera's priority level; the next batch uses it."""
        return run(lambda: cameras.set_priority(camera, change.priority))

    @app.delete(
        "/api/cameras/{camera}",
        tags=["cameras"],
        status_code=202,
        dependencies=guarded,
        responses=errors,
    )
    def remove_camera(camera: CAMERA_ID) -> CameraOut:
        """Stop the camera's decoder and drain it: the frames it sent are processed or counted
        (its state goes draining → removed; it stays in the list and the summary)."""
        return run(lambda: cameras.remove_camera(camera))

    @app.get(
        "/api/cameras/{camera}/frame.jpg",
        tags=["view"],
        dependencies=guarded,
        response_class=Response,
        responses={200: {"content": {"image/jpeg": {}}}, **invalid},
    )
    def frame(camera: CAMERA_ID) -> Response:
        """The camera's newest detected frame (as the model saw it) with its boxes."""
        jpeg = live.jpeg(camera, label)
        if jpeg is None:
            raise HTTPException(404, f"no frame of {camera!r} yet")
        return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "no-store"})

    @app.get("/api/stats", tags=["view"], dependencies=guarded, responses=denied)
    def stats() -> Stats:
        summary = control.accounting.summary(RECENT_FRAMES)
        return Stats(
            batch_sizes={str(size): count for size, count in summary.batch_sizes.items()},
            mean_batch_size=summary.mean_batch_size,
            detector_utilization=utilization(),
            latency_p50_s=summary.latency_p50_s,
            latency_p99_s=summary.latency_p99_s,
        )

    @app.get("/", include_in_schema=False, dependencies=guarded)
    def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.exception_handler(HTTPException)
    def problem(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    def unprocessable(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_problems(exc)}, 422)

    return app


def host_name(host: str) -> str:
    """The name in a Host header, without its port (``[::1]:9108`` -> ``::1``)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def bind(listen: str) -> socket.socket:
    """The listening socket, bound here so a taken port is a start-up error naming the
    setting (exit 2), not a log line from a thread."""
    host, port = split_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"http.listen {listen}: cannot listen there ({exc.strerror})") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


class HttpServer:
    """uvicorn on a thread, on a socket bound before (``bind``); ``close`` stops it."""

    def __init__(self, app: FastAPI, sock: socket.socket):
        self._sock = sock
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # its records go to the daemon's own handlers and format
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fb-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self) -> None:
        self._thread.start()
        log.info("http: metrics, health, API and live view on %s", self.url)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(SERVER_STOP_S)
        self._sock.close()
