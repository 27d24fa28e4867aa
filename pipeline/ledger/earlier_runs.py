"""What an earlier run left in the frames streams, accounted for by the run after it.

A daemon killed mid-run leaves frames in its streams (unread, or read and never acknowledged)
and perhaps its decoders' end entries.  They are not this run's frames: each is acknowledged
and written to the camera's ledger as ``previous_run``.  The earlier run's account of a session
stops where it died, so the frames between the last one it accounted for (its last detection
or ledger entry of that session, found in Redis) and the first one left in the stream were
trimmed by the stream's cap meanwhile: they are written as ``overflow`` so that the session's
ledger stays whole.

Frames the earlier run had read and still held (in its batching queue, or in a batch) when it
died are pending in the group, but a live stream's cap may have trimmed their entries while
they waited: such an entry comes back empty, without its session or seq.  Once every entry the
earlier run left for a camera has been read (``settle``), the holes in the earlier sessions'
account (seqs between ones it accounted for, with neither a detection nor a ledger entry) are
exactly those frames, and are written as ``previous_run``.
"""

from __future__ import annotations

import redis

from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from streams.groups import CLAIM_PAGE, ensure_group, pending_ids
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import (
    DetectionMessage,
    EndOfStream,
    LedgerEntry,
    message_kind,
    session_progress,
)

LOOK_BACK = 500  # newest detection and ledger entries searched for a session's last account


class EarlierRuns:
    """Owned by one batch worker's reader thread."""

    def __init__(self, *, redis_client: redis.Redis, keys: StreamKeys, accounting: Accounting):
        self._redis = redis_client
        self._keys = keys
        self._accounting = accounting
        self._last: dict[tuple[str, str], int] = {}  # (camera, session) -> last seq accounted
        self._unsettled: set[str] = set()  # cameras with leftovers whose holes are not filled
        self._ended: set[str] = set()  # sessions whose end entry was read

    def trimmed(self, camera: str) -> None:
        """An entry the earlier run had read came back empty: its frame is a hole to fill."""
        self._unsettled.add(camera)

    def frame(self, camera: str, session: str, seq: int) -> list[LedgerEntry]:
        """A frame an earlier run left: the gap before it, then the frame itself."""
        self._unsettled.add(camera)
        entries = self._gap(camera, session, seq)
        entries.append(self._accounting.on_previous_run(camera, session, seq))
        return entries

    def settle(self, camera: str, current: set[str], *, always: bool = False) -> list[LedgerEntry]:
        """Every entry the earlier runs left for ``camera`` has been read: fill the holes in
        the account of their sessions (not those in ``current``, this run's), then end the
        session whose decoder died without an end entry, with the frame count it kept in
        its progress hash (the frames after its last one accounted were trimmed)."""
        if camera not in self._unsettled and not always:
            return []
        self._unsettled.discard(camera)
        accounted, lows = _accounted_seqs(self._redis, self._keys, camera)
        entries = []
        for session, seqs in accounted.items():
            if session in current or not session or session not in lows:
                continue
            holes = sorted(set(range(lows[session], max(seqs) + 1)) - seqs)
            for seq in holes:  # merged into runs when written
                entries.append(self._accounting.on_previous_run(camera, session, seq))
        progress = session_progress(self._redis.hgetall(self._keys.progress(camera)))
        if progress is not None and progress[0] not in current | self._ended:
            session, frames, _redis_down = progress
            entries += self._gap(camera, session, frames)
            entries.append(LedgerEntry(camera, session, "end", -1, frames, "crashed"))
            self._ended.add(session)
            self._redis.delete(self._keys.progress(camera))
        return entries

    def unsettled(self, camera: str) -> bool:
        return camera in self._unsettled

    def unsettled_cameras(self) -> list[str]:
        return sorted(self._unsettled)

    def end(self, end: EndOfStream) -> list[LedgerEntry]:
        """An earlier run's decoder ended and that run never read the end entry."""
        self._ended.add(end.session)
        entries = self._gap(end.camera, end.session, end.frames) if end.frames >= 0 else []
        if end.decode_errors:
            entries.append(
                self._accounting.on_previous_run(
                    end.camera, end.session, -1, end.decode_errors, "decode_error"
                )
            )
        entries.append(LedgerEntry(end.camera, end.session, "end", -1, end.frames, end.reason))
        return entries

    def _gap(self, camera: str, session: str, seq: int) -> list[LedgerEntry]:
        key = (camera, session)
        last = self._last[key] if key in self._last else self._last_accounted(camera, session)
        self._last[key] = max(last, seq)
        if not session or seq <= last + 1:
            return []
        return [
            self._accounting.on_previous_run(camera, session, last + 1, seq - last - 1, "overflow")
        ]

    def _last_accounted(self, camera: str, session: str) -> int:
        """The highest seq of ``session`` that has a detection or a ledger drop (-1: none)."""
        last = -1
        for _id, fields in self._redis.xrevrange(self._keys.detections(camera), count=LOOK_BACK):
            if fields.get(b"session", b"").decode() == session:
                last = max(last, DetectionMessage.from_fields(fields).seq)
                break  # detections come in seq order within a session
        for _id, fields in self._redis.xrevrange(self._keys.ledger(camera), count=LOOK_BACK):
            entry = LedgerEntry.from_fields(fields)
            if entry.session == session and entry.kind == "drop" and entry.first_seq >= 0:
                last = max(last, entry.first_seq + entry.count - 1)
        return last


def _accounted_seqs(
    client: redis.Redis, keys: StreamKeys, camera: str
) -> tuple[dict[str, set[int]], dict[str, int]]:
    """Seqs of each session with a detection or a ledger drop among the newest ``LOOK_BACK``
    entries of each stream, and for each session the lowest seq from which that view is whole
    (a session cut by a full window is judged only above where the window reaches; one that a
    full window does not reach at all is not judged)."""
    accounted: dict[str, set[int]] = {}
    floors: list[dict[str, int]] = []
    windows = (
        (keys.detections(camera), lambda f: (f.get(b"session", b"").decode(), [int(f[b"seq"])])),
        (keys.ledger(camera), _ledger_seqs),
    )
    for key, seqs_of in windows:
        window = client.xrevrange(key, count=LOOK_BACK)
        lowest: dict[str, int] = {}
        for _id, fields in window:
            session, seqs = seqs_of(fields)
            if seqs:
                accounted.setdefault(session, set()).update(seqs)
                lowest[session] = min(lowest.get(session, seqs[0]), *seqs)
        if len(window) == LOOK_BACK:  # truncated: older entries may cover lower seqs
            floors.append(lowest)
    lows = {}
    for session, seqs in accounted.items():
        floor = min(seqs)
        for lowest in floors:
            if session not in lowest:
                break
            floor = max(floor, lowest[session])
        else:
            lows[session] = floor
    return accounted, lows


def _ledger_seqs(fields: dict[bytes, bytes]) -> tuple[str, list[int]]:
    entry = LedgerEntry.from_fields(fields)
    return entry.session, list(entry.seqs)


def drain(
    client: redis.Redis,
    keys: StreamKeys,
    cameras: list[str],
    *,
    accounting: Accounting,
    acks: FrameAcks,
) -> int:
    """Account for everything runs that are over left in these cameras' frames streams: each
    frame and end entry goes into the ledger (``previous_run``, and the gaps before them) and
    is acknowledged and deleted.  Only for cameras no daemon serves now.  It reads with XRANGE
    and acknowledges by id, so it leaves no consumer behind in the group.  Returns the
    entries drained."""
    earlier = EarlierRuns(redis_client=client, keys=keys, accounting=accounting)
    drained = 0
    for camera in cameras:
        key = keys.frames(camera)
        ensure_group(client, key)
        pending = pending_ids(client, key)
        after = "-"
        while page := client.xrange(key, min=after, count=CLAIM_PAGE):
            for entry_id, fields in page:
                pending.discard(entry_id)
                if message_kind(fields) == "end":
                    ledger = earlier.end(EndOfStream.from_fields(fields))
                else:
                    session = fields.get(b"session", b"").decode()
                    ledger = earlier.frame(camera, session, int(fields[b"seq"]))
                acks.acknowledge(key, [entry_id], ledger)
                drained += 1
            after = b"(" + page[-1][0]
        if pending:  # read and held by a run that stopped, then trimmed: holes to fill
            earlier.trimmed(camera)
            client.xack(key, FRAMES_GROUP, *pending)
        acks.acknowledge(key, [], earlier.settle(camera, set(), always=True))
    return drained
