"""``GET /metrics``: the registry in Prometheus text format, open (no token)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def router(registry: CollectorRegistry) -> APIRouter:
    """The metrics route, exposing ``registry``."""
    routes = APIRouter()

    @routes.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return routes
