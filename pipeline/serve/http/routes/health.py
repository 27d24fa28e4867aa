"""``GET /healthz`` (liveness) and ``GET /readyz`` (readiness), open as Kubernetes expects."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from pipeline.serve.control import Control
from pipeline.serve.http.models import Problem


def router(control: Control) -> APIRouter:
    """The probes, answered from the supervisor's ``control``."""
    routes = APIRouter()

    @routes.get("/healthz", tags=["health"], responses={503: {"model": Problem}})
    def healthz() -> dict[str, str]:
        """Liveness: the supervisor ticks (it waits out a Redis outage within its
        reconnect timeout; a dead batch worker ends the run)."""
        if not control.alive():
            raise HTTPException(503, "the supervisor has stopped ticking")
        return {"status": "ok"}

    @routes.get("/readyz", tags=["health"], responses={503: {"model": Problem}})
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

    return routes
