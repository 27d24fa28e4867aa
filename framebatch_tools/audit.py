"""Audit what runs left in Redis: every frame of every decoder session has its detections or a
ledger entry that says why not (``streams.messages.LedgerEntry``), across crashes and restarts.

A session's frames are seq 0 .. n-1, where n comes from its end entry or, for a session whose
decoder died without one, from the highest seq anything mentions.  Detections repeated by
at-least-once delivery are counted as duplicates and de-duplicated by ``frame_id``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from streams.keys import StreamKeys
from streams.messages import DetectionMessage, Fields, LedgerEntry

READ_PAGE = 1000


@dataclass
class CameraAudit:
    camera: str
    sessions: int = 0
    frames: int = 0  # frames of every session, those lost in decoding (no seq) included
    detected: int = 0  # frames with detections (unique frame ids)
    duplicates: int = 0  # detection messages past the first of their frame
    dropped: Counter[str] = field(default_factory=Counter)  # frames with a seq, by cause
    lost_in_decoding: int = 0  # frames that never got a seq (ledger drops with first_seq -1)
    unaccounted: list[str] = field(default_factory=list)  # frame ids with neither
    detected_and_dropped: int = 0  # detections of frames a ledger also drops (not previous_run)
    #: detections of frames past their session's end count: written after the session was
    #: ended elsewhere (a decoder that was not fenced out); not in ``ok``, since a decoder
    #: SIGKILLed between its frame and its progress (unfenced: ``framebatch run``) makes one
    after_end: int = 0

    @property
    def ok(self) -> bool:
        return not self.unaccounted and not self.detected_and_dropped

    def line(self) -> str:
        dropped = ", ".join(f"{c} {n}" for c, n in sorted(self.dropped.items())) or "none"
        return (
            f"camera {self.camera}: {self.sessions} sessions, {self.frames} frames = "
            f"{self.detected} detected + dropped ({dropped}); {len(self.unaccounted)} "
            f"unaccounted; {self.duplicates} duplicate detections; lost in decoding "
            f"{self.lost_in_decoding}; {self.after_end} after their session's end; "
            f"{self.detected_and_dropped} both detected and dropped"
        )


def _entries(client: redis.Redis, key: str):
    start = "-"
    while page := client.xrange(key, min=start, count=READ_PAGE):
        yield from page
        start = b"(" + page[-1][0]


def audit_camera(client: redis.Redis, keys: StreamKeys, camera: str) -> CameraAudit:
    """The audit of what Redis holds now for ``camera``."""
    return audit_entries(
        camera,
        (fields for _id, fields in _entries(client, keys.detections(camera))),
        (fields for _id, fields in _entries(client, keys.ledger(camera))),
    )


def audit_entries(
    camera: str, detections: Iterable[Fields], ledger: Iterable[Fields]
) -> CameraAudit:
    """The audit of a camera's detection and ledger entries (as Redis stores their fields),
    from Redis or from a consumer that kept them across Redis restarts."""
    report = CameraAudit(camera)
    detected: dict[str, set[int]] = defaultdict(set)
    dropped: dict[str, dict[int, str]] = defaultdict(dict)
    ends: dict[str, int] = {}
    for fields in detections:
        message = DetectionMessage.from_fields(fields)
        if message.seq in detected[message.session]:
            report.duplicates += 1
        detected[message.session].add(message.seq)
    for fields in ledger:
        entry = LedgerEntry.from_fields(fields)
        if entry.kind == "end":
            ends[entry.session] = max(ends.get(entry.session, -1), entry.count)
        elif entry.first_seq < 0:
            report.lost_in_decoding += entry.count
            report.dropped[entry.cause] += entry.count
        else:
            for seq in entry.seqs:
                dropped[entry.session].setdefault(seq, entry.cause)
    report.after_end = sum(
        seq >= ends[session]
        for session, seqs in detected.items()
        if session in ends
        for seq in seqs
    )
    for session in sorted(set(detected) | set(dropped) | set(ends)):
        seen = detected[session] | set(dropped[session])
        frames = max(ends.get(session, -1), max(seen, default=-1) + 1)
        report.sessions += 1
        report.frames += frames
        for seq in range(frames):
            cause = dropped[session].get(seq)
            if seq in detected[session]:
                report.detected += 1
                if cause is not None and cause != "previous_run":
                    report.detected_and_dropped += 1
            elif cause is not None:
                report.dropped[cause] += 1
            else:
                report.unaccounted.append(f"{session}:{seq}")
    report.frames += report.lost_in_decoding  # so frames = detected + dropped + unaccounted
    return report


def audit(client: redis.Redis, keys: StreamKeys, cameras: list[str]) -> list[CameraAudit]:
    """One report per camera, from its detections and ledger streams."""
    return [audit_camera(client, keys, camera) for camera in cameras]
