"""The camera registry: the cameras of a deployment, in Redis under its prefix, so that every
process of it (decode and detect workers on many hosts, a ``run`` daemon) works from one list
that outlives them, and a camera added through any of their APIs is known to all.

Each camera is its config entry as validated (``CameraConfig``, as JSON) with a version: the
registry's change counter when it was last written.  Keys, one hash slot on Redis Cluster
(their braces): ``<prefix>:registry:{cameras}`` (id -> entry), ``...:versions`` (id ->
version), ``...:removing`` and ``...:stopped`` (ids being removed, and of those, whose decoder
stopped) and ``...:version`` (the counter).  Every
write is one Lua script that checks what the writer expects first: the camera absent (an add),
at the version the writer read (a change, a removal), or anything (the config's seeding).  Two
writers racing: one wins, the other is told the version it lost to (:class:`RegistryConflict`).

A removal has steps, so that no frame is left behind: :meth:`CameraRegistry.remove` marks the
camera *removing*; its decoder stops, and the process that ran it says so
(:meth:`~CameraRegistry.decoder_stopped`, ``...:stopped``); the detector worker that holds it
reads its stream to the end, finishes its last frames and :meth:`~CameraRegistry.retire` s it,
which deletes it; its id may then be added again.

Processes follow the registry by reading its counter each tick and, when it moved, the
versions (:class:`RegistryFollower`): a change is seen within a tick, and one missed (a process
cut off from Redis for a while) is never lost, because the follower compares what is there
with what it applied rather than replaying a log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import redis

from pipeline.config import CameraConfig
from streams.keys import StreamKeys

log = logging.getLogger(__name__)

#: KEYS: entries, versions, removing, counter, stopped; ARGV: camera, what ('put', 'removing',
#: 'retire'), entry JSON (put), expected ('absent', 'any' or a version).  Returns {1, new
#: counter} written, {0, counter} nothing to change (a put of the same entry), or the refusal
#: with the camera's version: {-1, v} present (expected absent), {-2, v or 0} not at the
#: version expected (or absent), {-3, v} being removed (a put or a second removal).
_WRITE = """
local current = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local expected = ARGV[4]
local what = ARGV[2]
if what ~= 'retire' and redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then
  return {-3, current}
end
if expected == 'absent' then
  if current ~= 0 then return {-1, current} end
elseif expected ~= 'any' and tonumber(expected) ~= current then
  return {-2, current}
end
if what ~= 'put' and current == 0 then return {-2, 0} end
if what == 'put' and expected == 'any' and redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[3] then
  return {0, tonumber(redis.call('GET', KEYS[4]) or '0')}
end
local version = redis.call('INCR', KEYS[4])
if what == 'retire' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[1])
  redis.call('SREM', KEYS[5], ARGV[1])
  return {1, version}
end
if what == 'put' then redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
if what == 'removing' then redis.call('SADD', KEYS[3], ARGV[1]) end
redis.call('HSET', KEYS[2], ARGV[1], version)
return {1, version}
"""


#: KEYS: removing, stopped; ARGV: camera.
_DECODER_STOPPED = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then redis.call('SADD', KEYS[2], ARGV[1]) end
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
    removing: bool = False


def entry_json(camera: CameraConfig) -> str:
    """What the registry keeps of a camera: its validated entry, settings left at their
    defaults out (so an entry reads back the same under a later version's defaults)."""
    return json.dumps(camera.model_dump(mode="json", exclude_defaults=True), sort_keys=True)


class CameraRegistry:
    def __init__(self, client: redis.Redis, keys: StreamKeys, *, base: str | None = None):
        """``base``: the registry's first key (default: ``<prefix>:registry:{cameras}``)."""
        self._redis = client
        base = base or f"{keys.prefix}:registry:{{cameras}}"
        self._keys = [
            base,
            f"{base}:versions",
            f"{base}:removing",
            f"{base}:version",
            f"{base}:stopped",
        ]
        self._write = client.register_script(_WRITE)
        self._stop = client.register_script(_DECODER_STOPPED)

    # --- writing ------------------------------------------------------------------------------
    def add(self, camera: CameraConfig) -> int:
        """Registers a new camera; its version.  :class:`RegistryConflict` if the id is taken
        (or still being removed)."""
        return self._run(camera.id, "put", entry_json(camera), "absent")

    def change(self, camera: CameraConfig, expected: int) -> int:
        """Replaces a camera's entry, if it is still at version ``expected``; the new version."""
        return self._run(camera.id, "put", entry_json(camera), str(expected))

    def remove(self, camera: str, expected: int | None = None) -> int:
        """Marks a camera being removed (at version ``expected``, when given); its version."""
        return self._run(camera, "removing", "", "any" if expected is None else str(expected))

    def retire(self, camera: str) -> int:
        """A camera removed and drained: deleted, its id free again."""
        return self._run(camera, "retire", "", "any")

    def decoder_stopped(self, camera: str) -> None:
        """The decoder of a camera being removed has exited: nothing more comes into its
        stream (a camera not being removed is left as it is)."""
        self._stop(keys=[self._keys[2], self._keys[4]], args=[camera])

    def is_decoder_stopped(self, camera: str) -> bool:
        return bool(self._redis.sismember(self._keys[4], camera))

    def seed(self, cameras: Iterable[CameraConfig]) -> None:
        """The config's cameras, as the config has them: added, or changed where they differ;
        cameras the registry holds besides (added through an API) stay.  A camera being
        removed is left to its removal (said in the log): the next start adds it again."""
        for camera in cameras:
            try:
                self._run(camera.id, "put", entry_json(camera), "any")
            except RegistryConflict as exc:
                log.warning("camera %s: not seeded from the config: %s", camera.id, exc)

    def _run(self, camera: str, what: str, entry: str, expected: str) -> int:
        status, value = self._write(keys=self._keys, args=[camera, what, entry, expected])
        status, value = int(status), int(value)
        if status >= 0:
            return value
        if status == -1:
            raise RegistryConflict(f"camera id {camera!r} is in use", value)
        if status == -3:
            raise RegistryConflict(f"camera {camera!r} is being removed", value)
        if value == 0:
            raise RegistryConflict(f"camera {camera!r} is not in the registry", 0)
        raise RegistryConflict(
            f"camera {camera!r} changed since version {expected} (now version {value}): "
            "read it again and retry",
            value,
        )

    # --- reading ------------------------------------------------------------------------------
    def version(self) -> int:
        """The change counter: moves with every write that changed something."""
        return int(self._redis.get(self._keys[3]) or 0)

    def versions(self) -> tuple[int, dict[str, int]]:
        """The counter and each camera's version, read together."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self._keys[3])
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
        pipe.smismember(self._keys[2], names)
        entries, versions, removing = pipe.execute()
        found = {}
        for name, entry, version, gone in zip(names, entries, versions, removing, strict=True):
            if entry is None or version is None:
                continue  # retired meanwhile
            camera = _validated(name, entry)
            if camera is not None:
                found[name] = RegisteredCamera(camera, int(version), bool(gone))
        return found

    def get(self, camera: str) -> RegisteredCamera | None:
        return self.entries([camera]).get(camera)

    def cameras(self) -> dict[str, RegisteredCamera]:
        return self.entries(self.versions()[1])


#: where the start-up probe puts its registry, under the probe key (``registry_probes``; the
#: check removes its keys: ``streams.redis_access``)
PROBE_SUFFIX = ":registry"


def registry_probes(client: redis.Redis, key: str) -> list[tuple[str, Callable[[], object]]]:
    """(what, call) for the commands the registry runs (in its scripts: HGET, HSET, HDEL,
    INCR, GET, SADD, SREM, SISMEMBER; and HGETALL, HMGET, SMISMEMBER in transactions), on a
    registry of probe keys under ``key``, for the start-up check of the Redis user's rights."""
    registry = CameraRegistry(client, StreamKeys("probe"), base=key + PROBE_SUFFIX)
    probe = CameraConfig(id="probe", url="rtsp://probe/probe")
    return [
        ("EVALSHA (camera registry: a change)", lambda: registry.seed([probe])),
        ("EVALSHA (camera registry: a removal)", lambda: registry.remove("probe")),
        ("EVALSHA (camera registry: a decoder stopped)", lambda: registry.decoder_stopped("probe")),
        ("HMGET, SMISMEMBER (camera registry)", registry.cameras),
        ("SISMEMBER (camera registry)", lambda: registry.is_decoder_stopped("probe")),
        ("EVALSHA (camera registry: retired)", lambda: registry.retire("probe")),
    ]


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
    """What changed since the follower last looked: cameras added, changed (new entries),
    being removed, and retired (gone from the registry)."""

    added: tuple[RegisteredCamera, ...] = ()
    changed: tuple[RegisteredCamera, ...] = ()
    removing: tuple[RegisteredCamera, ...] = ()
    retired: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removing or self.retired)


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
        #: reported being removed: a removal ends only in a retirement, so one of these found
        #: registered again was retired and added back between two looks
        self._removing: set[str] = set()

    def changes(self) -> RegistryChanges:
        if self._settled and self._registry.version() == self._counter:
            return RegistryChanges()
        counter, versions = self._registry.versions()
        stale = [c for c, v in versions.items() if self._applied.get(c) != v]
        entries = self._registry.entries(stale)
        ours = [entries[c] for c in stale if c in entries]
        # retired and added back unseen: retired now (forgotten), added at the next look
        back = {e.config.id for e in ours if not e.removing and e.config.id in self._removing}
        current = [e for e in ours if not e.removing and e.config.id not in back]
        found = RegistryChanges(
            added=tuple(e for e in current if e.config.id not in self._applied),
            changed=tuple(e for e in current if e.config.id in self._applied),
            removing=tuple(e for e in ours if e.removing),
            retired=tuple(sorted({c for c in self._applied if c not in versions} | back)),
        )
        self._removing |= {e.config.id for e in found.removing}
        self._removing -= set(found.retired)
        self._counter = counter
        self._settled = not found
        return found

    def applied(self, camera: str, version: int) -> None:
        """The process runs ``camera`` as registered at ``version``."""
        self._applied[camera] = version

    def forgot(self, camera: str) -> None:
        """The process no longer runs ``camera`` (it was retired)."""
        self._applied.pop(camera, None)

    def version(self, camera: str) -> int:
        """The version of ``camera`` the process runs (0: none), what its own writes expect."""
        return self._applied.get(camera, 0)


def registry_versions(registry: CameraRegistry, cameras: Iterable[CameraConfig]) -> dict[str, int]:
    """The registry's versions of ``cameras`` (a process's config, seeded already), but for
    those being removed: a follower given these sees those as being removed at its first look."""
    entries = registry.entries(camera.id for camera in cameras)
    return {camera: entry.version for camera, entry in entries.items() if not entry.removing}


def differing(before: CameraConfig, after: CameraConfig) -> set[str]:
    """The settings that differ between two entries of a camera."""
    old, new = before.model_dump(), after.model_dump()
    return {name for name in new if old.get(name) != new[name]}
