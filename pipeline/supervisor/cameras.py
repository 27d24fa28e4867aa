"""Cameras changed while running, through the HTTP API (``pipeline.serve.http.CameraOps``):
carried out on the supervisor's thread (``Control.submit``), each change going through the
same path as the config's own cameras.

A camera added is validated as a config entry, what an earlier run left in its stream is
accounted for, then its decoder starts and a detector worker reads it.  A camera removed
drains: its decoder stops, and once every decoder session it had has ended and every frame it
sent is processed or counted, it is ``removed`` (it stays in the list, the metrics and the
summary; its id may be added again).  Cameras added live are not written back to the config.

With a camera registry (``run`` without ``--until-done``: :mod:`pipeline.fleet.registry`),
each change is written there first, checked against the version this daemon runs (a change
made meanwhile through another process wins, and the request is told so: 409); the registry
keeps the cameras an API added over a restart, and a change another process wrote is carried
out here at the next tick, as if it had come through this API.  A camera removed stays in the
registry, being removed, until it has drained here; then its id is free again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.batching import CameraRules
from pipeline.config import MAX_CAMERAS_PER_DAEMON, CameraConfig, Config
from pipeline.config.analytics import AnalyticsConfig
from pipeline.config.errors import ConfigError, format_validation_errors
from pipeline.errors import BadInput
from pipeline.fleet.following import DETECTOR_SETTINGS, note_unapplied
from pipeline.fleet.registry import (
    CameraRegistry,
    RegisteredCamera,
    RegistryConflict,
    RegistryFollower,
    differing,
    registry_versions,
)
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.earlier_runs import drain
from pipeline.serve.control import CameraConflict, CameraNotFound, CameraStates, CameraView
from pipeline.supervisor.builders import camera_rules
from pipeline.supervisor.decoders import DecoderSupervisor
from pipeline.supervisor.detectors import DetectorPool
from pipeline.supervisor.part import Part
from pipeline.supervisor.services import Services
from streams.groups import ensure_group
from streams.urls import redact_url

log = logging.getLogger(__name__)


def validated_camera(data: dict[str, Any], config_dir: Path) -> CameraConfig:
    """A camera of the API, validated as a config entry (relative paths from ``config_dir``);
    ``ConfigError`` (422) names each field."""
    try:
        return CameraConfig.model_validate(data, context={"base_dir": config_dir})
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, CameraConfig), "camera") from None


def validated_analytics(data: Any) -> AnalyticsConfig | None:
    """Analytics settings of the API (``None``: off), validated as ``cameras[].analytics``."""
    try:
        return None if data is None else AnalyticsConfig.model_validate(data)
    except ValidationError as exc:
        lines = format_validation_errors(exc, AnalyticsConfig)
        raise ConfigError([f"analytics.{line}" for line in lines], "analytics") from None


def checked_analytics(
    pool: DetectorPool, camera: str, settings: AnalyticsConfig | None, source: str
) -> None:
    """A class the model lacks, refused before anything changes (422)."""
    try:
        pool.check_analytics(camera, settings)
    except BadInput as exc:
        raise ConfigError([str(exc)], source) from None


class LiveCameras(Part):
    """``framebatch run``'s cameras as the API changes them; owned by the supervisor's thread."""

    def __init__(
        self,
        config: Config,
        services: Services,
        *,
        config_dir: Path,
        until_done: bool,
        decoders: DecoderSupervisor,
        pool: DetectorPool,
        registry: CameraRegistry | None = None,
    ):
        """``config_dir``: where relative file paths of cameras added are resolved (the
        config's folder, as for the config's own cameras); ``registry``: seeded with the
        config's cameras already, followed from here on."""
        self._config = config
        self._registry = registry
        self._follower = (
            None
            if registry is None
            else RegistryFollower(registry, registry_versions(registry, config.cameras))
        )
        self._postponed: set[str] = set()  # registry changes that could not be applied yet
        self._config_dir = config_dir
        self._until_done = until_done
        self._decoders = decoders
        self._pool = pool
        self._services = services
        self._control = services.control
        self._live = services.live
        self._redis = services.client
        self._keys = services.keys
        self._acks = services.acks

    @property
    def _states(self) -> CameraStates:
        return self._control.states

    @property
    def _accounting(self) -> Accounting:
        return self._control.accounting

    def add_camera(self, data: dict[str, Any]) -> CameraView:
        """Validate a camera as a config entry, start its decoder and give it to a worker."""
        if self._until_done:
            raise CameraConflict("a --until-done run takes its cameras from the config only")
        camera = validated_camera(data, self._config_dir)
        self._check_new(camera)
        if self._registry is not None:
            version = self._registered(lambda r: r.add(camera))
            self._follower.applied(camera.id, version)  # type: ignore[union-attr]
        self._start(camera)
        return self._control.camera(camera.id)

    def _check_new(self, camera: CameraConfig) -> None:
        """What refuses a camera before anything starts (409, 422)."""
        known = self._decoders.known(camera.id)
        if known and self._states.state(camera.id) != "removed":
            raise CameraConflict(f"camera id {camera.id!r} is in use")
        if self._decoders.active() >= MAX_CAMERAS_PER_DAEMON:
            active = self._decoders.active()
            raise CameraConflict(f"{active} cameras: the most one daemon runs")
        maxlen = self._config.redis.frames_maxlen
        if camera.max_backlog is not None and camera.max_backlog > maxlen:
            raise ConfigError([f"max_backlog: must be <= redis.frames_maxlen ({maxlen})"], "camera")
        checked_analytics(self._pool, camera.id, camera.analytics, "camera")

    def _start(self, camera: CameraConfig) -> None:
        if not self._decoders.known(camera.id):  # what an earlier run left, as at start
            drain(
                self._redis, self._keys, [camera.id], accounting=self._accounting, acks=self._acks
            )
        ensure_group(self._redis, self._keys.frames(camera.id))
        self._replace(camera)
        self._services.show_camera(camera)
        self._accounting.track(camera.id)
        self._decoders.add(camera)
        self._pool.set_analytics(camera.id, camera.analytics)
        self._pool.assign(camera.id, self._rules(camera))
        log.info("camera %s added (%s)", camera.id, redact_url(camera.url))

    def set_priority(self, camera_id: str, priority: int) -> CameraView:
        self._active(camera_id)
        camera = self._config.camera(camera_id).model_copy(update={"priority": priority})
        self._write_change(camera)
        self._apply_rules(camera)
        return self._control.camera(camera_id)

    def _apply_rules(self, camera: CameraConfig) -> None:
        camera_id, priority = camera.id, camera.priority
        self._replace(camera)
        self._states.set_priority(camera_id, priority)
        self._pool.set_rules(camera_id, self._rules(camera))

    def analytics(self, camera_id: str) -> AnalyticsConfig | None:
        """The camera's analytics settings now (any thread)."""
        return self._pool.analytics(camera_id)

    def set_analytics(self, camera_id: str, data: Any) -> CameraView:
        """New analytics settings (``None``: off), validated as the config's
        ``cameras[].analytics``; the camera's next frame follows them, its counts carried on
        (its tracks too, unless the tracker's settings changed)."""
        self._active(camera_id)
        settings = validated_analytics(data)
        checked_analytics(self._pool, camera_id, settings, "analytics")
        latest = self._live.latest(camera_id)
        if settings is not None and latest is not None:  # regions beyond its frames
            # supervision is imported where analytics are used: the GPU check's machine lacks it
            from pipeline.analytics.geometry import FrameGeometry, RegionDoesNotFit

            g = latest[0].geometry
            try:
                FrameGeometry.resolve(settings, g.width, g.height, "analytics")
            except RegionDoesNotFit as exc:
                raise ConfigError([str(exc)], "analytics") from None
        camera = self._config.camera(camera_id).model_copy(update={"analytics": settings})
        self._write_change(camera)
        self._apply_analytics(camera)
        return self._control.camera(camera_id)

    def _apply_analytics(self, camera: CameraConfig) -> None:
        self._replace(camera)
        self._pool.set_analytics(camera.id, camera.analytics)
        log.info("camera %s: analytics %s", camera.id, "changed" if camera.analytics else "off")

    def remove_camera(self, camera_id: str) -> CameraView:
        """Stop the camera's decoder; it is removed once drained (``tick``)."""
        self._active(camera_id)
        if self._registry is not None:  # removing there until drained here (_finish_removals)
            expected = self._follower.version(camera_id)  # type: ignore[union-attr]
            version = self._registered(lambda r: r.remove(camera_id, expected))
            self._follower.applied(camera_id, version)  # type: ignore[union-attr]
        self._remove(camera_id)
        return self._control.camera(camera_id)

    def _remove(self, camera_id: str) -> None:
        self._decoders.remove(camera_id)
        self._pool.draining(camera_id)
        self._states.set(camera_id, "draining")
        log.info("camera %s: removing (draining its frames)", camera_id)

    def tick(self) -> None:
        self._follow_registry()
        self._finish_removals()

    # --- the registry ---------------------------------------------------------------------------
    def _registered(self, write: Callable[[CameraRegistry], int]) -> int:
        """A write to the registry; the loser of a race is told (409)."""
        try:
            return write(self._registry)  # type: ignore[arg-type]
        except RegistryConflict as exc:
            raise CameraConflict(str(exc)) from None

    def _write_change(self, camera: CameraConfig) -> None:
        if self._registry is not None:
            expected = self._follower.version(camera.id)  # type: ignore[union-attr]
            version = self._registered(lambda r: r.change(camera, expected))
            self._follower.applied(camera.id, version)  # type: ignore[union-attr]

    def _follow_registry(self) -> None:
        """Carry out what other processes wrote to the registry."""
        if self._follower is None:
            return
        changes = self._follower.changes()
        for entry in changes.added:
            self._apply_added(entry)
        for entry in changes.changed:
            self._apply_changed(entry)
        for entry in changes.removing:
            camera_id = entry.config.id
            if self._decoders.known(camera_id) and not self._decoders.removing(camera_id):
                log.info("camera %s: removed in the registry", camera_id)
                self._remove(camera_id)
            elif not self._decoders.known(camera_id):  # never ran here: nothing to drain
                self._retire(camera_id)
            self._follower.applied(camera_id, entry.version)
        for camera_id in changes.retired:
            if self._decoders.known(camera_id) and not self._decoders.removing(camera_id):
                self._remove(camera_id)
            self._follower.forgot(camera_id)

    def _retire(self, camera_id: str) -> None:
        """Removed and drained here: the registry lets its id go."""
        if self._registry is None:
            return
        try:
            self._registry.retire(camera_id)
        except RegistryConflict:
            pass  # retired already (by another process that ran it)
        self._follower.forgot(camera_id)  # type: ignore[union-attr]

    def _apply_added(self, entry: RegisteredCamera) -> None:
        camera = entry.config
        try:
            self._check_new(camera)
        except (CameraConflict, ConfigError) as exc:  # its id still draining, say: again later
            if camera.id not in self._postponed:
                log.warning("camera %s: added in the registry, not started yet: %s", camera.id, exc)
                self._postponed.add(camera.id)
            return
        self._postponed.discard(camera.id)
        self._start(camera)
        self._follower.applied(camera.id, entry.version)  # type: ignore[union-attr]
        log.info("camera %s: added from the registry (version %d)", camera.id, entry.version)

    def _apply_changed(self, entry: RegisteredCamera) -> None:
        camera = entry.config
        if not self._decoders.known(camera.id) or self._decoders.removing(camera.id):
            # being removed here (its id comes back as an add once retired): nothing to change
            self._follower.applied(camera.id, entry.version)  # type: ignore[union-attr]
            return
        settings = differing(self._config.camera(camera.id), camera)
        if settings & DETECTOR_SETTINGS:
            self._apply_rules(camera)  # the camera's batching rules, its priority with them
        if "analytics" in settings:
            self._apply_analytics(camera)
        note_unapplied(camera, settings - DETECTOR_SETTINGS)
        self._follower.applied(camera.id, entry.version)  # type: ignore[union-attr]

    def _finish_removals(self) -> None:
        """Cameras drained: every decoder session ended and every frame read counted."""
        for camera in self._decoders.removals():
            if self._states.state(camera) == "removed" or not self._decoders.gone(camera):
                continue
            if self._accounting.outstanding(camera):
                continue
            self._pool.forget(camera)
            self._decoders.retire(camera)
            self._live.forget(camera)
            self._states.set(camera, "removed")
            self._retire(camera)
            log.info("camera %s removed", camera)

    def _active(self, camera_id: str) -> None:
        if not self._decoders.known(camera_id):
            raise CameraNotFound(camera_id)
        if self._decoders.removing(camera_id):
            state = self._states.state(camera_id)
            raise CameraConflict(f"camera {camera_id!r} is {state}: it is being removed or was")

    def _replace(self, camera: CameraConfig) -> None:
        """The camera's entry in this run's config: replaced, or added at the end."""
        cameras = [c for c in self._config.cameras if c.id != camera.id]
        at = next((i for i, c in enumerate(self._config.cameras) if c.id == camera.id), None)
        cameras.insert(len(cameras) if at is None else at, camera)
        self._config = self._config.model_copy(update={"cameras": cameras})

    def _rules(self, camera: CameraConfig) -> CameraRules:
        return camera_rules(self._config, camera, until_done=self._until_done)
