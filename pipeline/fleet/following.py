"""``framebatch detect`` following the camera registry (:mod:`pipeline.fleet.registry`), at
the supervisor's tick (:class:`RegisteredLeases`): every camera registered is competed for
through the leases, with its settings as registered; once a removed camera's decoder has
stopped, the worker that holds it reads its stream to the end, finishes its frames, then
retires it (another worker takes that over if this one dies meanwhile).  ``framebatch decode``
follows it in :mod:`pipeline.fleet.sharded`.

A detector worker takes a camera's new detector settings (priority, waits, freshness,
analytics) live; a decoder's (its URL, its sampling...) take effect at the camera's next
decoder session (removed and added again, or handed to another decode worker), which the
decode worker's log says.
"""

from __future__ import annotations

import logging

from pipeline.config import CameraConfig
from pipeline.errors import BadInput
from pipeline.fleet.registry import (
    CameraRegistry,
    RegisteredCamera,
    RegistryConflict,
    RegistryFollower,
)
from pipeline.supervisor.detectors import DetectorPool
from pipeline.supervisor.part import Part
from pipeline.supervisor.services import Services

log = logging.getLogger(__name__)

#: what a detector worker takes live; the rest of a camera's entry is its decoder's
DETECTOR_SETTINGS = frozenset(
    {"priority", "analytics", "max_wait_frames", "max_wait_ms", "max_frame_age_ms", "keep_latest"}
)


def note_unapplied(camera: CameraConfig, settings: set[str]) -> None:
    """Says which of a running camera's changed settings wait for its next decoder session."""
    if settings:
        log.warning(
            "camera %s: %s changed in the registry; a running camera takes these at its next "
            "decoder session (removed and added again, or taken over by another decode worker)",
            camera.id,
            ", ".join(sorted(settings)),
        )


class RegisteredLeases(Part):
    """``framebatch detect``'s cameras as the registry has them."""

    def __init__(self, registry: CameraRegistry, pool: DetectorPool, services: Services):
        self._registry = registry
        self._services = services
        # the config's cameras are the pool's already; following them again changes nothing
        self._follower = RegistryFollower(registry)
        self._pool = pool
        self._removing: set[str] = set()
        self._refused: set[str] = set()  # said once

    def tick(self) -> None:
        changes = self._follower.changes()
        for entry in changes.added + changes.changed:
            self._follow(entry)
        for entry in changes.removing:
            self._services.states.set(entry.config.id, "draining")
            self._removing.add(entry.config.id)
            self._follower.applied(entry.config.id, entry.version)
        for camera in changes.retired:
            self._services.states.set(camera, "removed")
            self._removing.discard(camera)
            self._pool.unfollow(camera)
            self._follower.forgot(camera)
        for camera in sorted(self._removing):
            if self._registry.is_decoder_stopped(camera) and self._pool.drained(camera):
                self._retire(camera)

    def _follow(self, entry: RegisteredCamera) -> None:
        camera = entry.config
        try:
            self._pool.follow(camera)
        except BadInput as exc:  # analytics naming a class the model lacks
            if camera.id not in self._refused:
                log.warning("camera %s: registered, not read here: %s", camera.id, exc)
                self._refused.add(camera.id)
            return
        self._refused.discard(camera.id)
        if self._services.states.state(camera.id) is None:
            self._services.show_camera(camera)
        self._follower.applied(camera.id, entry.version)

    def _retire(self, camera: str) -> None:
        try:
            self._registry.retire(camera)
        except RegistryConflict:
            pass  # retired already: another worker held it last
        log.info("camera %s: drained and retired from the registry", camera)
        self._services.states.set(camera, "removed")
        self._removing.discard(camera)
        self._pool.unfollow(camera)
        self._follower.forgot(camera)
