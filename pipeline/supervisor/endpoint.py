"""The run's HTTP endpoint (metrics, health, the camera API, the live view): its socket bound
before anything slow starts, the server started once the parts it shows exist, so it answers
``/healthz`` while the models load.  The HTTP stack is imported only where it serves."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from pipeline.config import Config
from pipeline.supervisor.services import Services

if TYPE_CHECKING:
    from pipeline.analytics.snapshots import SnapshotStore
    from pipeline.serve.http import CameraOps

log = logging.getLogger(__name__)


def bind_http(config: Config, stack: ExitStack) -> socket.socket | None:
    """The HTTP socket of ``http.listen``.  A port set in the config or with --http that is
    taken is bad input (exit 2); the default one taken (another daemon on this host) only
    costs this run its endpoint, with a warning, as running several daemons is how one goes
    past 256 cameras."""
    listen = config.http.listen
    if listen is None:
        return None
    from pipeline.serve.http import bind

    try:
        sock = bind(listen)
    except ValueError:
        if "listen" in config.http.model_fields_set:
            raise
        log.warning(
            "http: %s is taken (another framebatch?): no metrics, API or live view for this "
            "run; set http.listen (or --http) to serve them elsewhere",
            listen,
        )
        return None
    stack.callback(sock.close)
    return sock


def start_http(
    sock: socket.socket | None,
    services: Services,
    *,
    cameras: CameraOps | None,
    label: Callable[[int], str] = str,
    token: str | None,
    stack: ExitStack,
    snapshots: SnapshotStore | None = None,
    decoders: Callable[[], dict[str, Any]] | None = None,
) -> str | None:
    """The endpoint on its own thread; returns its URL (None when there is no socket).
    ``cameras``: the camera changes the API may make; None: metrics and health only.
    ``snapshots``: the store ``/api/events`` serves event snapshots from; ``decoders``: a
    decode worker's placement (``/api/decoders``)."""
    if sock is None:
        return None
    from pipeline.serve.events import EventLog
    from pipeline.serve.http import HttpServer, build_app

    control = services.control
    events = EventLog(
        services.client,
        services.keys,
        cameras=lambda: [view.id for view in control.cameras()],
        snapshots=snapshots,
    )

    app = build_app(
        control=services.control,
        cameras=cameras,
        registry=services.registry,
        live=services.live,
        utilization=services.metrics.utilization.ratio,
        label=label,
        token=token,
        events=events if cameras is not None else None,
        decoders=decoders,
    )
    serves = "metrics and health" if cameras is None else "metrics, health, API and live view"
    serves += ", /api/decoders" if decoders is not None else ""
    server = HttpServer(app, sock, serves)
    server.start()
    stack.callback(server.close)
    return server.url
