"""The daemon's HTTP endpoint on ``http.listen``: metrics, health, the camera API, the live view.

* ``GET /metrics``: Prometheus text format (``pipeline.serve.metrics``);
* ``GET /healthz``: 200 while the supervisor ticks (liveness; a batch worker that dies ends
  the run);
  ``GET /readyz``: 200 once the model is loaded and warm and Redis answers (readiness);
* ``/api/cameras``: list, add (validated as a config's camera), change priority, remove
  (the camera drains: its frames are all processed or counted); OpenAPI at ``/openapi.json``,
  browsed at ``/docs`` (Swagger UI) or ``/redoc``, their assets served locally;
* ``GET /``: the live view (``pipeline/serve/web/index.html``), frames at
  ``/api/cameras/{id}/frame.jpg``.

With ``http.token`` set, the API and the view need ``Authorization: Bearer <token>`` (the page
takes it as ``?token=``); without one (loopback only) they take only loopback ``Host`` headers,
and changes only as ``application/json``. Every request body is at most 64 KiB, refused before
it is read when its ``Content-Length`` says more (:mod:`.limits`). ``/metrics`` and the probes
stay open, as Prometheus and Kubernetes expect. The server (uvicorn) runs on its own thread;
every change to the pipeline is carried out by the supervisor's thread
(``pipeline.serve.control``).

The app is assembled in :mod:`.app` from one router per concern (:mod:`.routes`), the access
rules of :mod:`.security` and the request and response models of :mod:`.models`;
:mod:`.server` binds the socket and runs uvicorn.
"""

from pipeline.serve.http.app import build_app, validation_problems
from pipeline.serve.http.handles import CameraOps, PipelineHandles
from pipeline.serve.http.limits import MAX_BODY_BYTES, BodyLimit
from pipeline.serve.http.models import (
    CAMERA_ID,
    CAMERA_ID_PATTERN,
    CameraOut,
    PriorityIn,
    Problem,
    Stats,
    camera_schema,
)
from pipeline.serve.http.routes.view import PAGE
from pipeline.serve.http.security import LOOPBACK_NAMES, BearerCredentials, host_name
from pipeline.serve.http.server import SERVER_STOP_S, HttpServer, bind

__all__ = [
    "CAMERA_ID",
    "CAMERA_ID_PATTERN",
    "LOOPBACK_NAMES",
    "MAX_BODY_BYTES",
    "PAGE",
    "SERVER_STOP_S",
    "BearerCredentials",
    "BodyLimit",
    "CameraOps",
    "CameraOut",
    "HttpServer",
    "PipelineHandles",
    "PriorityIn",
    "Problem",
    "Stats",
    "bind",
    "build_app",
    "camera_schema",
    "host_name",
    "validation_problems",
]
