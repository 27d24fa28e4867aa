"""``/api/cameras``: list, add, read, change the priority of, and remove cameras."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from pipeline.config import ConfigError
from pipeline.serve.control import CameraConflict, CameraNotFound, CameraView, Control
from pipeline.serve.http.handles import PipelineHandles
from pipeline.serve.http.models import CAMERA_ID, CameraOut, PriorityIn, Problem, camera_schema
from pipeline.serve.http.security import Access


def out(view: CameraView) -> CameraOut:
    return CameraOut(**asdict(view))


async def json_body(request: Request, expected: str) -> Any:
    """The request's body parsed (capped before and while it is read: ``BodyLimit``); 422
    naming what was ``expected`` when it is not JSON."""
    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
        raise HTTPException(422, f"the body must be {expected}") from None


def carried_out(control: Control, apply: Callable[[], CameraView]) -> CameraOut:
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


def router(pipeline: PipelineHandles, access: Access) -> APIRouter:
    """The camera API over ``pipeline``'s control and camera changes, guarded by ``access``."""
    control, cameras = pipeline.control, pipeline.cameras
    routes = APIRouter()

    @routes.get("/api/cameras", tags=["cameras"], dependencies=access.read, responses=access.denied)
    def list_cameras() -> list[CameraOut]:
        return [out(view) for view in control.cameras()]

    @routes.post(
        "/api/cameras",
        tags=["cameras"],
        status_code=201,
        dependencies=access.change,
        responses={**access.errors, **access.unsupported},
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
        data = await json_body(request, "a JSON object")
        if not isinstance(data, dict):
            raise HTTPException(422, "the body must be a JSON object (a camera)")
        return await asyncio.to_thread(carried_out, control, lambda: cameras.add_camera(data))

    @routes.get(
        "/api/cameras/{camera}", tags=["cameras"], dependencies=access.read, responses=access.errors
    )
    def get_camera(camera: CAMERA_ID) -> CameraOut:
        try:
            return out(control.camera(camera))
        except CameraNotFound:
            raise HTTPException(404, f"no camera {camera!r}") from None

    @routes.patch(
        "/api/cameras/{camera}",
        tags=["cameras"],
        dependencies=access.change,
        responses={
            **access.errors,
            **access.unsupported,
            400: {"model": Problem, "description": "The body is not JSON"},
        },
    )
    def set_priority(camera: CAMERA_ID, change: PriorityIn) -> CameraOut:
        """Change a camera's priority level; the next batch uses it."""
        return carried_out(control, lambda: cameras.set_priority(camera, change.priority))

    @routes.delete(
        "/api/cameras/{camera}",
        tags=["cameras"],
        status_code=202,
        dependencies=access.read,
        responses=access.errors,
    )
    def remove_camera(camera: CAMERA_ID) -> CameraOut:
        """Stop the camera's decoder and drain it: the frames it sent are processed or counted
        (its state goes draining → removed; it stays in the list and the summary)."""
        return carried_out(control, lambda: cameras.remove_camera(camera))

    return routes
