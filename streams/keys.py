"""Every Redis key and group name framebatch uses, in one place (the wire contract).

Every key of one camera carries the camera's id as a Redis Cluster hash tag,
``<prefix>:frames:{<camera>}``: a cluster hashes only the part in braces, so a camera's frames,
detections, ledger, progress, lease and position share one slot, and a transaction or script
over them (ledger entry, position and acknowledgement together) is legal on a cluster.  Keys of
different cameras spread over the cluster's nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Consumer group through which the batcher reads every camera's frame stream.
FRAMES_GROUP = "framebatch-batcher"


@dataclass(frozen=True)
class StreamKeys:
    """Key names under one prefix, e.g. ``<prefix>:frames:{<camera>}``."""

    prefix: str = "fb"

    def frames(self, camera: str) -> str:
        """Stream of letterboxed frames for one camera (bounded, ``MAXLEN ~``)."""
        return f"{self.prefix}:frames:{_tag(camera)}"

    def camera_from_frames(self, key: str | bytes) -> str:
        """Inverse of :meth:`frames`."""
        return self._untag(key, "frames")

    def detections(self, camera: str) -> str:
        """Stream of detection messages for one camera, one entry per decoded frame."""
        return f"{self.prefix}:detections:{_tag(camera)}"

    def detections_pattern(self) -> str:
        """SCAN pattern that matches every camera's detection stream."""
        return f"{self.prefix}:detections:*"

    def camera_from_detections(self, key: str | bytes) -> str:
        """Inverse of :meth:`detections`."""
        return self._untag(key, "detections")

    def ledger(self, camera: str) -> str:
        """Stream of what became of frames that have no detection message: drops by cause,
        and each decoder session's end (``streams.messages.LedgerEntry``)."""
        return f"{self.prefix}:ledger:{_tag(camera)}"

    def progress(self, camera: str) -> str:
        """Hash of the camera's running decoder session: ``session``, ``frames`` (seqs used so
        far) and ``redis_down``; written with each frame, so that the end of a session whose
        decoder died without its end entry is still known."""
        return f"{self.prefix}:progress:{_tag(camera)}"

    def workers(self) -> str:
        """Sorted set of the live detector workers, scored by when their heartbeat runs out
        (``pipeline.leases.camera_leases``)."""
        return f"{self.prefix}:workers"

    def lease(self, camera: str) -> str:
        """The id of the detector worker that reads this camera now (expires with its TTL)."""
        return f"{self.prefix}:lease:{_tag(camera)}"

    def decode_workers(self) -> str:
        """Sorted set of the live decode workers (``framebatch decode``), scored like
        :meth:`workers`: they share the cameras through :meth:`decode_lease`."""
        return f"{self.prefix}:decode-workers"

    def decode_capacity(self) -> str:
        """Hash of each decode worker's capacity (``decoding.worker_capacity``; empty: no
        limit), read by every decode worker for the plan (``pipeline.leases.placement``)."""
        return f"{self.prefix}:decode-capacity"

    def decode_lease(self, camera: str) -> str:
        """The id of the decode worker that decodes this camera now (expires with its TTL);
        every frame that worker writes checks it (``streams.fence``)."""
        return f"{self.prefix}:decode-lease:{_tag(camera)}"

    def decoded(self, camera: str) -> str:
        """Set once a file camera's decoding ended (its job is done, whatever the end: a file
        is decoded once per registration), holding the session that ended it."""
        return f"{self.prefix}:decoded:{_tag(camera)}"

    def cursor(self, camera: str) -> str:
        """Hash of how far the camera's frames have been accounted for at receipt (session,
        last seq, redis_down seen, ended): where the next worker to read it takes over."""
        return f"{self.prefix}:cursor:{_tag(camera)}"

    def object_events(self, camera: str) -> str:
        """Stream of the camera's analytics events (``streams.object_events.ObjectEvent``):
        tracks starting and ending, zone entries and exits, line crossings, loitering."""
        return f"{self.prefix}:events:{_tag(camera)}"

    def object_events_pattern(self) -> str:
        """SCAN pattern that matches every camera's analytics events stream."""
        return f"{self.prefix}:events:{{*}}"

    def camera_from_object_events(self, key: str | bytes) -> str:
        """Inverse of :meth:`object_events`."""
        return self._untag(key, "events")

    def analytics_state(self, camera: str) -> str:
        """The camera's tracker and zone state (``pipeline.analytics``), written with the
        acknowledgement of the frames it has seen: where the next worker to read the camera
        carries its tracks and counts on."""
        return f"{self.prefix}:analytics:{_tag(camera)}"

    def events(self) -> str:
        """Stream of status events (camera opened, disconnected, failed, ended)."""
        return f"{self.prefix}:events"

    def _untag(self, key: str | bytes, kind: str) -> str:
        text = key.decode() if isinstance(key, bytes) else key
        return text[len(f"{self.prefix}:{kind}:") :].removeprefix("{").removesuffix("}")


def _tag(camera: str) -> str:
    """The camera's hash tag: its keys share one Redis Cluster slot (ids never hold braces)."""
    return "{" + camera + "}"
