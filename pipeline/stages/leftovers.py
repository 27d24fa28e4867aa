"""The reader's side of earlier runs: entries of the frames streams that are not this run's
frames, acknowledged and written to the ledger as they are read (:mod:`pipeline.ledger.earlier_runs`
says how they are counted).

* an entry older than the run's start (Redis time ``since_ms``): an earlier run's frame or
  its decoder's end entry;
* a pending entry that comes back empty: its frame was trimmed while an earlier run held it;
* once a camera's first frame of this run arrives, the earlier run's entries (older) are all
  read: the holes in its sessions' account are filled.
"""

from __future__ import annotations

from pipeline.ledger.earlier_runs import EarlierRuns
from pipeline.stages.context import WorkerContext
from streams.messages import EndOfStream, message_kind


class EarlierRunEntries:
    """Owned by one reader thread."""

    def __init__(self, context: WorkerContext, *, since_ms: int):
        """``since_ms``: Redis time at which this run began; older entries are an earlier
        run's (0: every entry is this run's, as for detector workers that come and go)."""
        self._context = context
        self._since_ms = since_ms
        self._runs = EarlierRuns(
            redis_client=context.redis, keys=context.keys, accounting=context.accounting
        )

    def trimmed(self, camera: str) -> None:
        """Entries an earlier run held were trimmed before they could be claimed."""
        self._runs.trimmed(camera)

    def take(self, key: str, camera: str, entry_id: bytes, fields: dict[bytes, bytes]) -> bool:
        """Account for and acknowledge the entry if it is not this run's; True if it was."""
        acks = self._context.acks
        if not fields:  # pending, its frame trimmed: an earlier run's (ours are in memory)
            self._runs.trimmed(camera)
            acks.acknowledge(key, [entry_id])
            return True
        if int(entry_id.split(b"-")[0]) >= self._since_ms:
            return False
        # left by an earlier run (its last frames, its decoders' end entries): its own
        # sessions, not this run's, so acknowledged and its frames counted apart
        if message_kind(fields) == "end":
            entries = self._runs.end(EndOfStream.from_fields(fields))
        else:
            camera, session = fields[b"camera"].decode(), fields.get(b"session", b"").decode()
            entries = self._runs.frame(camera, session, int(fields[b"seq"]))
        acks.acknowledge(key, [entry_id], entries)
        return True

    def this_run_begins(self, key: str, camera: str, session: str) -> None:
        """A frame of this run (of ``session``) arrived: the earlier runs' entries are read."""
        if self._runs.unsettled(camera):
            self._context.acks.acknowledge(key, [], self._runs.settle(camera, {session}))

    def finish(self) -> None:
        """Reading ended: cameras where no frame of this run came are settled too."""
        for camera in self._runs.unsettled_cameras():
            holes = self._runs.settle(camera, set())
            self._context.acks.acknowledge(self._context.keys.frames(camera), [], holes)
