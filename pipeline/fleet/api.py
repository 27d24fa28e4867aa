"""``framebatch detect``'s camera API: each change is validated here, then written to the camera
registry (:mod:`pipeline.fleet.registry`), which every process follows, this one at its next
tick (:mod:`pipeline.fleet.following`).  A change checks the version it read a moment before:
of two APIs changing one camera at once, the second is refused (409) and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import CameraConfig
from pipeline.config.analytics import AnalyticsConfig
from pipeline.fleet.registry import CameraRegistry, RegisteredCamera, RegistryConflict
from pipeline.serve.control import CameraConflict, CameraNotFound, CameraView
from pipeline.supervisor.cameras import checked_analytics, validated_analytics, validated_camera
from pipeline.supervisor.detectors import DetectorPool
from pipeline.supervisor.services import Services


class RegisteredCameraOps:
    """Carried out on the supervisor's thread, as every API change."""

    def __init__(
        self, registry: CameraRegistry, services: Services, pool: DetectorPool, config_dir: Path
    ):
        self._registry = registry
        self._services = services
        self._pool = pool
        self._config_dir = config_dir

    def add_camera(self, data: dict[str, Any]) -> CameraView:
        camera = validated_camera(data, self._config_dir)
        checked_analytics(self._pool, camera.id, camera.analytics, "camera")
        self._written(lambda: self._registry.add(camera))
        self._services.show_camera(camera)  # listed at once; read once its decoder sends
        return self._services.control.camera(camera.id)

    def set_priority(self, camera: str, priority: int) -> CameraView:
        entry = self._entry(camera)
        changed = entry.config.model_copy(update={"priority": priority})
        self._written(lambda: self._registry.change(changed, entry.version))
        self._shown(changed)
        self._services.states.set_priority(camera, priority)
        return self._services.control.camera(camera)

    def analytics(self, camera: str) -> AnalyticsConfig | None:
        return self._pool.analytics(camera)

    def set_analytics(self, camera: str, data: Any) -> CameraView:
        entry = self._entry(camera)
        settings = validated_analytics(data)
        checked_analytics(self._pool, camera, settings, "analytics")
        changed = entry.config.model_copy(update={"analytics": settings})
        self._written(lambda: self._registry.change(changed, entry.version))
        self._shown(changed)
        return self._services.control.camera(camera)

    def remove_camera(self, camera: str) -> CameraView:
        entry = self._entry(camera)
        self._written(lambda: self._registry.remove(camera, entry.version))
        self._shown(entry.config)
        self._services.states.set(camera, "draining")
        return self._services.control.camera(camera)

    def _shown(self, camera: CameraConfig) -> None:
        """In this worker's list (a camera another process added a moment ago may not be)."""
        if self._services.states.state(camera.id) is None:
            self._services.show_camera(camera)

    def _entry(self, camera: str) -> RegisteredCamera:
        entry = self._registry.get(camera)
        if entry is None:
            raise CameraNotFound(camera)
        if entry.removing:
            raise CameraConflict(f"camera {camera!r} is being removed")
        return entry

    @staticmethod
    def _written(write: Any) -> int:
        try:
            return write()
        except RegistryConflict as exc:
            raise CameraConflict(str(exc)) from None
