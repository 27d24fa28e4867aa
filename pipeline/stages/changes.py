"""Cameras added, changed or let go while a batch worker runs: commands from the supervisor's
thread (the camera API, the lease keeper), carried out by the reader between reads, as the
reader alone touches the batching policy."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pipeline.batching import CameraRules
from streams.messages import CameraPosition


@dataclass(frozen=True)
class CameraChange:
    kind: str  # add, adopt, rules, pause, drop, forget
    camera: str
    rules: CameraRules | None = None
    position: CameraPosition | None = None  # adopt: where the previous worker left it
    applied: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


class CameraChanges:
    """Cameras added, changed or let go while the reader runs (from the supervisor's thread);
    the reader applies them between reads, as it alone touches the policy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changes: list[CameraChange] = []

    def _append(self, change: CameraChange) -> CameraChange:
        with self._lock:
            self._changes.append(change)
        return change

    def add(self, camera: str, rules: CameraRules) -> None:
        """Read this camera's stream too, batched by ``rules``."""
        self._append(CameraChange("add", camera, rules))

    def adopt(self, camera: str, rules: CameraRules, position: CameraPosition) -> None:
        """Read a camera another worker read up to ``position`` (its unfinished frames are
        claimed already: pending on this reader's consumer)."""
        self._append(CameraChange("adopt", camera, rules, position))

    def set_rules(self, camera: str, rules: CameraRules) -> None:
        self._append(CameraChange("rules", camera, rules))

    def pause(self, camera: str) -> CameraChange:
        """Read no more of this camera; what it has waiting is still batched (a hand-over:
        the next worker reads on from where this one stopped).  ``applied`` is set once the
        reader has stopped reading it."""
        return self._append(CameraChange("pause", camera))

    def drop(self, camera: str) -> None:
        """Another worker holds this camera now: read no more of it and let go of its waiting
        frames unacknowledged (pending, they are the other worker's to claim)."""
        self._append(CameraChange("drop", camera))

    def forget(self, camera: str) -> None:
        """Stop reading a camera that ended (its end entry is read: nothing follows it)."""
        self._append(CameraChange("forget", camera))

    def take(self) -> list[CameraChange]:
        with self._lock:
            changes, self._changes = self._changes, []
        return changes
