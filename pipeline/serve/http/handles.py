"""What the routes are given of the running pipeline: its objects, bundled once by
:func:`pipeline.serve.http.app.build_app` and passed to the routers that need them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from pipeline.config.analytics import AnalyticsConfig
from pipeline.serve.control import CameraView, Control
from pipeline.serve.live_view import LiveFrames


class CameraOps(Protocol):
    """The changes the pipeline makes on its supervisor's thread."""

    def add_camera(self, data: dict[str, Any]) -> CameraView: ...

    def remove_camera(self, camera: str) -> CameraView: ...

    def set_priority(self, camera: str, priority: int) -> CameraView: ...

    def analytics(self, camera: str) -> AnalyticsConfig | None:
        """The camera's analytics settings now (any thread)."""

    def set_analytics(self, camera: str, data: Any) -> CameraView: ...


@dataclass(frozen=True)
class PipelineHandles:
    """The running pipeline's objects the routes read and change."""

    control: Control  # the supervisor's side: health, camera views, accounting, submit
    cameras: CameraOps  # add, remove, re-prioritise a camera, change its analytics
    registry: CollectorRegistry  # the metrics ``/metrics`` exposes
    live: LiveFrames  # the newest detected frame of each camera
    utilization: Callable[[], float]  # the detector's busy share, recent
    label: Callable[[int], str]  # a class id's name, for the boxes drawn on frames
