"""The camera registry: the cameras of a deployment, in Redis under its prefix, so that every
process of it (decode and detect workers on many hosts, a ``run`` daemon) works from one list
that outlives them, and a camera added through any of their APIs is known to all.

Each camera is its config entry as validated (``CameraConfig``, as JSON) with a version: the
registry's change counter when it was last written.  Keys, one hash slot on Redis Cluster
(their braces): ``<prefix>:registry:{cameras}`` (id -> entry), ``...:versions`` (id ->
version) and ``...:version`` (the counter).  Every write is one Lua script that checks what the
writer expects first: the camera absent (an add), at the version the writer read (a change, a
removal), or anything (the config's seeding).  Two writers racing: one wins, the other is told
the version it lost to (:class:`RegistryConflict`).

Processes follow the registry by reading its counter each tick and, when it moved, the
versions (:class:`RegistryFollower`): a change is seen within a tick, and one missed (a process
cut off from Redis for a while) is never lost, because the follower compares what is there
with what it applied rather than replaying a log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from pipeline.config import CameraConfig
from streams.keys import StreamKeys

log = logging.getLogger(__name__)

#: KEYS: entries, versions, counter; ARGV: camera, entry JSON ('' removes), expected ('absent',
#: 'any' or a version).  Returns {new counter, 0}, or {-1, version} (present, expected
#: absent), or {-2, version or 0} (not at the version expected).
_WRITE = """
local current = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local expected = ARGV[3]
if expected == 'absent' then
  if current ~= 0 then return {-1, current} end
elseif expected ~= 'any' and tonumber(expected) ~= current then
  return {-2, current}
end
if ARGV[2] == '' then
  if current == 0 then return {-2, 0} end
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return {redis.call('INCR', KEYS[3]), current}
end
if expected == 'any' and redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return {tonumber(redis.call('GET', KEYS[3]) or '0'), current}
end
local version = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], version)
return {version, current}
"""


class RegistryConflict(Exception):
    """A write that lost: the camera is there already, or changed (or removed) since the
    version the writer read.  ``version``: what the registry holds now (0: absent)."""

    def __init__(self, message: str, version: int):
        super().__init__(message)
        self.version = version


@dataclass(frozen=True)
class RegisteredCamera:
    config: CameraConfig
    version: int


def entry_json(camera: CameraConfig) -> str:
    """What the registry keeps of a camera: its validated entry, settings left at their
    defaults out (so an entry reads back the same under a later version's defaults)."""
    return json.dumps(camera.model_dump(mode="json", exclude_defaults=True), sort_keys=True)


class CameraRegistry:
    def __init__(self, client: redis.Redis, keys: StreamKeys):
        self._redis = client
        base = f"{keys.prefix}:registry:{{cameras}}"
        self._keys = (base, f"{base}:versions", f"{base}:version")
        self._write = client.register_script(_WRITE)

    # --- writing ------------------------------------------------------------------------------
    def add(self, camera: CameraConfig) -> int:
        """Registers a new camera; its version.  :class:`RegistryConflict` if the id is taken."""
        version, current = self._run(camera.id, entry_json(camera), "absent")
        if version < 0:
            raise RegistryConflict(f"camera id {camera.id!r} is in use", current)
        return version

    def change(self, camera: CameraConfig, expected: int) -> int:
        """Replaces a camera's entry, if it is still at version ``expected``; the new version."""
        version, current = self._run(camera.id, entry_json(camera), str(expected))
        if version < 0:
            raise self._lost(camera.id, expected, current)
        return version

    def remove(self, camera: str, expected: int | None = None) -> int:
        """Removes a camera (at version ``expected``, when given); the registry's version."""
        version, current = self._run(camera, "", "any" if expected is None else str(expected))
        if version < 0:
            raise self._lost(camera, expected, current)
        return version

    def seed(self, cameras: Iterable[CameraConfig]) -> None:
        """The config's cameras, as the config has them: added, or changed where they differ;
        cameras the registry holds besides (added through an API) stay."""
        for camera in cameras:
            self._run(camera.id, entry_json(camera), "any")

    def _run(self, camera: str, entry: str, expected: str) -> tuple[int, int]:
        version, current = self._write(keys=list(self._keys), args=[camera, entry, expected])
        return int(version), int(current)

    @staticmethod
    def _lost(camera: str, expected: int | None, current: int) -> RegistryConflict:
        if current == 0:
            return RegistryConflict(f"camera {camera!r} is not in the registry", 0)
        return RegistryConflict(
            f"camera {camera!r} changed since version {expected} (now version {current}): "
            "read it again and retry",
            current,
        )

    # --- reading ------------------------------------------------------------------------------
    def version(self) -> int:
        """The change counter: moves with every write that changed something."""
        return int(self._redis.get(self._keys[2]) or 0)

    def versions(self) -> tuple[int, dict[str, int]]:
        """The counter and each camera's version, read together."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self._keys[2])
        pipe.hgetall(self._keys[1])
        counter, versions = pipe.execute()
        return int(counter or 0), {_text(c): int(v) for c, v in versions.items()}

    def entries(self, cameras: Iterable[str]) -> dict[str, RegisteredCamera]:
        """The cameras named that are registered, validated (an entry no longer valid under
        this version is left out, said in the log)."""
        names = list(cameras)
        if not names:
            return {}
        pipe = self._redis.pipeline(transaction=True)
        pipe.hmget(self._keys[0], names)
        pipe.hmget(self._keys[1], names)
        entries, versions = pipe.execute()
        found = {}
        for name, entry, version in zip(names, entries, versions, strict=True):
            if entry is None or version is None:
                continue  # removed meanwhile
            camera = _validated(name, entry)
            if camera is not None:
                found[name] = RegisteredCamera(camera, int(version))
        return found

    def get(self, camera: str) -> RegisteredCamera | None:
        return self.entries([camera]).get(camera)

    def cameras(self) -> dict[str, RegisteredCamera]:
        return self.entries(self.versions()[1])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _validated(name: str, entry: bytes | str) -> CameraConfig | None:
    try:
        return CameraConfig.model_validate(json.loads(entry))
    except ValueError as exc:  # pydantic's ValidationError too
        first = str(exc).splitlines()[:3]
        log.warning("camera %s: registry entry not valid here, left out: %s", name, " ".join(first))
        return None


@dataclass(frozen=True)
class RegistryChanges:
    """What changed since the follower last looked: cameras added, changed (new entries) and
    removed."""

    added: tuple[RegisteredCamera, ...] = ()
    changed: tuple[RegisteredCamera, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


class RegistryFollower:
    """A process's view of the registry: what it applied, and what changed since.

    :meth:`changes` tells what differs from what the process confirmed it applied
    (:meth:`applied`, :meth:`forgot`); a change not confirmed (one the process could not carry
    out yet: an id still draining) comes again at the next call."""

    def __init__(self, registry: CameraRegistry, applied: Mapping[str, int] | None = None):
        """``applied``: the cameras (and versions) the process runs already."""
        self._registry = registry
        self._applied: dict[str, int] = dict(applied or {})
        self._counter = -1  # unknown: the first look reads the versions
        self._settled = False

    def changes(self) -> RegistryChanges:
        if self._settled and self._registry.version() == self._counter:
            return RegistryChanges()
        counter, versions = self._registry.versions()
        stale = [c for c, v in versions.items() if self._applied.get(c) != v]
        entries = self._registry.entries(stale)
        added = tuple(entries[c] for c in stale if c in entries and c not in self._applied)
        changed = tuple(entries[c] for c in stale if c in entries and c in self._applied)
        removed = tuple(sorted(c for c in self._applied if c not in versions))
        self._counter = counter
        found = RegistryChanges(added, changed, removed)
        self._settled = not found
        return found

    def applied(self, camera: str, version: int) -> None:
        """The process runs ``camera`` as registered at ``version``."""
        self._applied[camera] = version

    def forgot(self, camera: str) -> None:
        """The process no longer runs ``camera`` (it is removing it)."""
        self._applied.pop(camera, None)

    def version(self, camera: str) -> int:
        """The version of ``camera`` the process runs (0: none), what its own writes expect."""
        return self._applied.get(camera, 0)


def registry_versions(registry: CameraRegistry, cameras: Iterable[CameraConfig]) -> dict[str, int]:
    """The registry's versions of ``cameras`` (a process's config, seeded already)."""
    versions = registry.versions()[1]
    return {camera.id: versions[camera.id] for camera in cameras if camera.id in versions}


def differing(before: CameraConfig, after: CameraConfig) -> set[str]:
    """The settings that differ between two entries of a camera."""
    old, new = before.model_dump(), after.model_dump()
    return {name for name in new if old.get(name) != new[name]}
