"""The reader stage (the batch worker's own thread): ``XREADGROUP`` over every camera, each
entry to the accounting and the batching policy, and, when the policy dispatches, each frame's
pixels out of its transport (inline, JPEG or shared memory; a frame lost in transport drops
with its cause) into a prepared batch (``Detector.prepare``) for the inferer.

The reader alone touches the policy.  Whatever an entry reveals as dropped goes into the
camera's ledger before the entry is acknowledged.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import redis

from detectors.detector import Detector
from pipeline.batching import BatchPolicy, CameraRules, Dropped, Queued
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.ledger.earlier_runs import EarlierRuns, claim_pending
from pipeline.stages.batches import PendingFrame, PreparedBatch
from pipeline.stages.inferer import InferenceMeter
from pipeline.stages.lifecycle import Handoff, Lifecycle
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import (
    CameraPosition,
    EndOfStream,
    FrameMessage,
    LedgerEntry,
    message_kind,
)
from streams.redis_cluster import GroupsMissing, read_streams
from streams.redis_connect import is_nogroup
from streams.transport import FrameDecoder, TransportLost

log = logging.getLogger(__name__)

IDLE_BLOCK_MS = 100
STRAY_PAGE = 1000  # frames of one gap looked for on other workers at most


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


class FrameReader:
    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        redis_client: redis.Redis,
        keys: StreamKeys,
        cameras: list[str],
        detector: Detector,
        policy: BatchPolicy[PendingFrame],
        accounting: Accounting,
        acks: FrameAcks,
        outbox: Handoff[PreparedBatch],
        meter: InferenceMeter,
        frame_decoder: FrameDecoder,
        until_done: bool,
        consumer_name: str,
        since_ms: int,
        changes: CameraChanges | None = None,
        track_positions: bool = False,
        may_read: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
    ):
        """``since_ms``: Redis time at which this run began; older entries are an earlier run's.
        ``changes``: cameras added or removed while running.  ``track_positions``: keep each
        camera's position in Redis for the worker that may read it next (camera leases).
        ``may_read``: false while the camera leases may have run out (reads wait)."""
        self._lifecycle = lifecycle
        self._changes = changes or CameraChanges()
        self._redis = redis_client
        self._keys = keys
        self._cameras = list(cameras)
        self._detector = detector
        self._policy = policy
        self._accounting = accounting
        self._acks = acks
        self._outbox = outbox
        self._meter = meter
        self._frames = frame_decoder
        self._until_done = until_done
        self._consumer = consumer_name
        self._since_ms = since_ms
        self._clock = clock
        self._track_positions = track_positions
        self._may_read = may_read
        # adopted cameras: frames up to here were received by their previous worker
        self._claimed_through: dict[str, CameraPosition] = {}
        self._last_entry: dict[str, str] = {}  # per stream: the newest entry received
        self._earlier_runs = EarlierRuns(
            redis_client=redis_client, keys=keys, accounting=accounting
        )
        self._batch_ids = itertools.count()
        # Start with this consumer's own pending entries (left by a crash), then new ones.
        self._read_ids = {keys.frames(camera): "0" for camera in cameras}
        self._camera_of = {keys.frames(camera): camera for camera in cameras}

    def claim_pending(self) -> int:
        """Take over the frames another consumer read and never acknowledged (a worker that
        crashed, or had another name in an earlier run), so this worker's own pending read
        sees them; returns how many were claimed.  Each camera has one worker at a time."""
        claimed = 0
        for key, camera in self._camera_of.items():
            try:
                taken, trimmed = claim_pending(self._redis, key, self._consumer)
            except redis.ResponseError as exc:
                if not is_nogroup(exc):
                    raise
                # Redis (this key's node, on a cluster) restarted empty while the model loaded
                self._recreate_groups([key])
                continue
            claimed += taken
            if trimmed:
                self._earlier_runs.trimmed(camera)
        return claimed

    def run(self) -> None:
        """Read until stopped, failed or (``until_done``) every camera ended; then dispatch
        what the policy holds, and close the hand-off to the inferer."""
        try:
            self._read_loop()
            for camera in self._earlier_runs.unsettled_cameras():  # no frame of this run came
                holes = self._earlier_runs.settle(camera, set())
                self._acks.acknowledge(self._keys.frames(camera), [], holes)
        finally:
            self._outbox.close()

    def _read_loop(self) -> None:
        policy, stop = self._policy, self._lifecycle.stop
        while not self._lifecycle.failed:
            self._apply_changes()
            for size, seconds in self._meter.samples():
                policy.observe(size, seconds)
            if stop.is_set() or (self._until_done and self._accounting.ended(self._cameras)):
                # stopping, or nothing more can arrive: what was read is in flight, finish it
                for batch in policy.flush():
                    self._dispatch(batch)
                return
            now = self._clock()
            idle = self._outbox.free  # the detector can take the next batch
            busy_for = self._meter.busy_for(policy.service.estimate)
            decision = policy.poll(now, idle=idle, start_delay_s=busy_for)
            self._drop(decision.dropped)
            if decision.batch:
                self._dispatch(decision.batch)
                continue
            wake_at = decision.wake_at
            block_s = IDLE_BLOCK_MS / 1000 if wake_at is None else max(wake_at - now, 0.001)
            if policy.waiting and not idle:
                # a batch waits for the detector: only its taking the prepared one lets us
                # dispatch, so sleep until then, and read what arrived meanwhile at once
                self._outbox.wait_taken(IDLE_BLOCK_MS / 1000)
                block_ms = None
            else:
                block_ms = max(1, int(block_s * 1000))
            # COUNT applies per stream: read only what cannot overflow the policy's queues
            per_stream = (policy.queues.max_waiting - policy.waiting) // max(1, len(self._read_ids))
            if per_stream >= 1 and self._read_ids and self._may_read():
                self._read(count=per_stream, block_ms=block_ms)
            elif block_ms is not None:
                stop.wait(block_s)  # full and idle: only a policy that waits on the clock

    def _apply_changes(self) -> None:
        for change in self._changes.take():
            camera, key = change.camera, self._keys.frames(change.camera)
            if change.kind in ("pause", "drop", "forget"):
                self._read_ids.pop(key, None)
                self._claimed_through.pop(key, None)
                if change.kind == "drop":
                    given_up = self._policy.queues.discard(camera)
                    self._accounting.hand_over(camera, len(given_up))
                if change.kind != "pause":
                    if camera in self._cameras:
                        self._cameras.remove(camera)
                    self._camera_of.pop(key, None)
                    self._frames.forget(camera)  # its shm ring, if any, is unmapped
                change.applied.set()
                continue
            assert change.rules is not None
            self._policy.queues.set_rules(camera, change.rules)
            if change.kind in ("add", "adopt") and key not in self._read_ids:
                if camera not in self._cameras:
                    self._cameras.append(camera)
                self._read_ids[key] = "0"  # own pending entries first, as at start
                self._camera_of[key] = camera
                self._policy.queues.make_room(len(self._read_ids))
            if change.kind == "adopt" and change.position is not None:
                self._accounting.adopt(camera, change.position)
                self._claimed_through[key] = change.position
            change.applied.set()

    def _read(self, *, count: int, block_ms: int | None) -> None:
        """XREADGROUP over every camera; ``block_ms=None`` returns at once."""
        try:
            reply = read_streams(
                self._redis,
                self._read_ids,
                group=FRAMES_GROUP,
                consumer=self._consumer,
                count=count,
                block_ms=block_ms,
            )
        except GroupsMissing as exc:  # a cluster node lost its data; the others' reads came
            self._recreate_groups(exc.keys)
            reply = exc.reply
        except redis.ResponseError as exc:
            if not is_nogroup(exc):
                raise
            self._recreate_groups()
            return
        if not self._may_read():
            # the reply came after this worker's leases may have run out (a read held up by an
            # outage): another worker may read these cameras now, and finds the entries
            # pending here when it meets their gap (``_recover_strays``)
            return
        dropped: list[Dropped[PendingFrame]] = []
        read: list[str] = []
        for key, entries in reply or []:
            key = key.decode()
            if self._read_ids[key] != ">" and not entries:
                self._read_ids[key] = ">"  # own pending history exhausted
                self._claimed_through.pop(key, None)
            for entry_id, fields in entries:
                if self._read_ids[key] != ">":
                    self._read_ids[key] = entry_id
                dropped += self._receive(key, entry_id, fields)
            if entries:
                read.append(self._camera_of[key])
        if self._track_positions and read:
            tx = self._acks.transactions(atomic=False)  # each position write stands alone
            for camera in read:
                self._acks.record_position(tx, camera, self._position(camera))
            self._acks.execute(tx)
        self._drop(dropped)

    def _acknowledge(self, key: str, ids: list[bytes], entries: list[LedgerEntry]) -> None:
        """Ledger entries the accounting just wrote, and the acknowledgement; with the
        camera's position in the same transaction when positions are kept (a worker taking
        the camera over must neither miss nor repeat these entries)."""
        camera = self._camera_of[key]
        position = self._position(camera) if self._track_positions else None
        self._acks.acknowledge(key, ids, entries, position=position, camera=camera)

    def _position(self, camera: str) -> CameraPosition:
        """The camera's position, never behind the one it was adopted at (claimed frames
        read back are older entries than that)."""
        key = self._keys.frames(camera)
        position = replace(
            self._accounting.position(camera), entry_id=self._last_entry.get(key, "0-0")
        )
        claimed = self._claimed_through.get(key)
        if claimed is not None and claimed.received(position.entry_id):
            position = replace(position, entry_id=claimed.entry_id)
        return position

    def _recreate_groups(self, keys: list[str] | None = None) -> None:
        """Redis restarted without its data: the streams and the group are gone.  Make the
        group again from the start of each stream (decoders may have re-created a stream
        already) and count the frames Redis lost at each camera's next gap.  ``keys``: the
        streams that lost their group (on a cluster, those of the node that restarted);
        default every stream."""
        log.warning(
            "Redis lost its data (a restart without persistence?): consumer group re-created; "
            "frames it held are counted as redis_lost"
        )
        keys = list(self._read_ids) if keys is None else [k for k in keys if k in self._read_ids]
        for key in keys:
            try:
                self._redis.xgroup_create(key, FRAMES_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._read_ids[key] = ">"  # our pending list went with it
        self._accounting.on_redis_lost([self._camera_of[key] for key in keys])

    def _receive(
        self, key: str, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> list[Dropped[PendingFrame]]:
        """Hand one entry to the accounting and the policy; returns what the policy shed."""
        strays = self._recover_strays(key, entry_id, fields) if self._track_positions else []
        return strays + self._receive_one(key, entry_id, fields)

    def _recover_strays(
        self, key: str, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> list[Dropped[PendingFrame]]:
        """Before a gap in seq is counted as dropped: the frames of the gap may be pending on
        another worker instead, read by it when it was cut off and its lease ran out (a read it
        sent before, carried out by Redis after).  Those are claimed and received first, in
        stream order, so they are processed here, in order, and the gap is only what is
        really missing."""
        claimed = self._claimed_through.get(key)
        if not fields or (claimed is not None and claimed.received(entry_id)):
            return []
        camera = self._camera_of[key]
        session = fields.get(b"session", b"").decode()
        if message_kind(fields) == "end":
            next_seq = int(fields[b"frames"])
        else:
            next_seq = int(fields[b"seq"])
        if not self._accounting.would_gap(camera, session, next_seq):
            return []
        after = self._last_entry.get(key, "0-0")
        pending = self._redis.xpending_range(
            key, FRAMES_GROUP, min=f"({after}", max=b"(" + entry_id, count=STRAY_PAGE
        )
        # this reader's own too: a reply it set aside (below) left its entries pending here
        ids = [p["message_id"] for p in pending]
        if not ids:
            return []
        strays = self._redis.xclaim(key, FRAMES_GROUP, self._consumer, 0, ids)
        log.warning("camera %s: %d frames another worker read were claimed", camera, len(strays))
        dropped: list[Dropped[PendingFrame]] = []
        for stray_id, stray_fields in strays:
            dropped += self._receive_one(key, stray_id, stray_fields or {})
        return dropped

    def _receive_one(
        self, key: str, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> list[Dropped[PendingFrame]]:
        claimed = self._claimed_through.get(key)
        if not fields and claimed is not None and claimed.received(entry_id):
            # received by the camera's previous worker, claimed, then trimmed from the stream
            # (an acknowledged frame leaves the pending list): lost with that worker
            camera = self._camera_of[key]
            self._accounting.on_claimed(camera)
            lost = self._accounting.on_shed(camera, "worker_lost", claimed.session or "")
            self._acknowledge(key, [entry_id], [lost])
            return []
        self._last_entry[key] = entry_id.decode()
        if not fields:  # a pending entry whose frame was trimmed: an earlier run's (ours
            # are in memory), in flight when it died
            self._earlier_runs.trimmed(self._camera_of[key])
            self._acks.acknowledge(key, [entry_id])
            return []
        kind = message_kind(fields)
        if int(entry_id.split(b"-")[0]) < self._since_ms:
            # left by an earlier run (its last frames, its decoders' end entries): its own
            # sessions, not this run's, so acknowledged and its frames counted apart
            if kind == "end":
                entries = self._earlier_runs.end(EndOfStream.from_fields(fields))
            else:
                camera, session = fields[b"camera"].decode(), fields.get(b"session", b"").decode()
                entries = self._earlier_runs.frame(camera, session, int(fields[b"seq"]))
            self._acks.acknowledge(key, [entry_id], entries)
            return []
        if kind == "end":
            end = EndOfStream.from_fields(fields)
            entries = self._accounting.on_end(
                end.camera,
                end.frames,
                end.reason,
                end.error,
                end.decode_errors,
                end.session,
                end.redis_down,
                end.sampled_out,
            )
            self._acknowledge(key, [entry_id], entries)
            return []
        frame = FrameMessage.from_fields(fields)
        if self._earlier_runs.unsettled(frame.camera):
            # this run's first frame: the earlier run's entries (older) are all read
            holes = self._earlier_runs.settle(self._camera_of[key], {frame.session})
            self._acks.acknowledge(key, [], holes)
        if claimed is not None and claimed.received(entry_id):
            # received by the camera's previous worker, never finished: ours now
            self._accounting.on_claimed(frame.camera)
        else:
            gaps = self._accounting.on_received(
                frame.camera, frame.seq, frame.session, frame.redis_down
            )
            if gaps is None:  # the same frame again: an XADD retried after a lost reply
                self._acks.acknowledge(key, [entry_id])
                return []
            if gaps:
                self._acknowledge(key, [], gaps)
        try:
            # pixels kept outside Redis are copied out now: a frame may wait in the batching
            # queue longer than its writer takes to come round its ring again
            image = self._frames.detach(frame)
        except TransportLost as exc:
            entry = self._accounting.on_shed(frame.camera, exc.cause, frame.session, frame.seq)
            self._acknowledge(key, [entry_id], [entry])
            return []
        pending = PendingFrame(entry_id, frame, image)
        return self._policy.add(frame.camera, frame.seq, frame.captured, pending, self._clock())

    def _drop(self, dropped: list[Dropped[PendingFrame]]) -> None:
        """Frames the policy shed (stale, superseded, overflow): counted, written to the ledger,
        acknowledged and deleted."""
        if not dropped:
            return
        tx = self._acks.transactions()
        entries = []
        for d in dropped:
            message = d.frame.item.message
            entries.append(
                self._accounting.on_shed(message.camera, d.cause, message.session, message.seq)
            )
        self._acks.write_ledger(tx, entries)
        for d in dropped:
            self._acks.ack_and_delete(
                tx, self._keys.frames(d.frame.camera), [d.frame.item.entry_id]
            )
        self._acks.execute(tx)

    def _dispatch(self, frames: list[Queued[PendingFrame]]) -> None:
        batched = self._clock()
        images, kept, lost = [], [], []
        for q in frames:
            try:
                if q.item.image is None:  # still in its transport: read it now, and keep it
                    # with the frame (the publisher hands it to the live view)
                    q = replace(q, item=replace(q.item, image=self._frames.image(q.item.message)))
                images.append(q.item.image)
                kept.append(q)
            except TransportLost as exc:  # counted, acknowledged and deleted like any drop
                lost.append(Dropped(q, exc.cause))
        self._drop(lost)
        # Rectangular letterboxing gives each source aspect its own shape: frames of one shape
        # run together (padding a mixed batch to a common shape would change a frame's
        # detections with its batch-mates).
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for index, image in enumerate(images):
            by_shape.setdefault(image.shape, []).append(index)
        for indices in by_shape.values():
            tensor = self._detector.prepare([images[i] for i in indices])
            frames_of_shape = [kept[i] for i in indices]
            self._outbox.put(PreparedBatch(next(self._batch_ids), frames_of_shape, tensor, batched))
