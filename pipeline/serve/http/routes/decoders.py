"""``/api/decoders`` (``framebatch decode``): the decode workers' plan as this worker sees it:
each worker's capacity and load, the cameras this one decodes, and the cameras no worker has
room for (unplaced: not decoded until one has)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter

from pipeline.serve.http.security import Access


def router(status: Callable[[], dict[str, Any]], access: Access) -> APIRouter:
    routes = APIRouter()

    @routes.get(
        "/api/decoders", tags=["decoders"], dependencies=access.read, responses=access.denied
    )
    def decoders() -> dict[str, Any]:
        """The decode workers' placement of the cameras, from this worker's last lease tick."""
        return status()

    return routes
