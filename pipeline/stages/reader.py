"""The reader stage (the batch worker's own thread): ``XREADGROUP`` over every camera, each
entry to the accounting and the batching policy, and, when the policy dispatches, each frame's
pixels out of its transport (inline, JPEG or shared memory; a frame lost in transport drops
with its cause) into a prepared batch (``Detector.prepare``) for the inferer.

The reader alone touches the policy.  Whatever an entry reveals as dropped goes into the
camera's ledger before the entry is acknowledged.  Entries that are not this run's frames
go to :class:`~pipeline.stages.leftovers.EarlierRunEntries`; what changes when cameras move
between detector workers, to :class:`~pipeline.stages.handover.CameraHandover`.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import replace

import redis

from detectors.detector import Detector
from pipeline.batching import BatchPolicy, Dropped, Queued
from pipeline.ledger.acks import StreamAck
from pipeline.stages.batches import PendingFrame, PreparedBatch
from pipeline.stages.changes import CameraChanges
from pipeline.stages.context import WorkerContext
from pipeline.stages.handover import NO_HANDOVER, NoHandover
from pipeline.stages.inferer import InferenceMeter
from pipeline.stages.leftovers import EarlierRunEntries
from pipeline.stages.lifecycle import Handoff, Lifecycle
from streams.groups import claim_pending, ensure_group
from streams.keys import FRAMES_GROUP
from streams.messages import EndOfStream, FrameMessage, LedgerEntry, message_kind
from streams.redis_cluster import GroupsMissing, StreamPolls, read_streams
from streams.redis_errors import is_nogroup
from streams.transport import FrameDecoder, TransportLost

log = logging.getLogger(__name__)

IDLE_BLOCK_MS = 100


class FrameReader:
    def __init__(
        self,
        context: WorkerContext,
        *,
        lifecycle: Lifecycle,
        cameras: list[str],
        detector: Detector,
        policy: BatchPolicy[PendingFrame],
        outbox: Handoff[PreparedBatch],
        meter: InferenceMeter,
        frame_decoder: FrameDecoder,
        finish: threading.Event,
        since_ms: int,
        changes: CameraChanges | None = None,
        handover: NoHandover = NO_HANDOVER,
    ):
        """``finish``: once set, read until every camera's end entry (from the start for a
        replay, ``--until-done``; when a run stops, so each camera's end is read).
        ``since_ms``: Redis time at which this run began; older entries are an earlier run's.
        ``changes``: cameras added or removed while running.  ``handover``: the reader's side
        of the camera leases, when cameras move between workers."""
        self._context = context
        self._lifecycle = lifecycle
        self._changes = changes or CameraChanges()
        self._redis = context.redis
        self._keys = context.keys
        self._accounting = context.accounting
        self._acks = context.acks
        self._clock = context.clock
        self._cameras = list(cameras)
        self._detector = detector
        self._policy = policy
        self._outbox = outbox
        self._meter = meter
        self._frames = frame_decoder
        self._finish = finish
        self._handover = handover
        self._earlier_runs = EarlierRunEntries(context, since_ms=since_ms)
        self._batch_ids = itertools.count()
        # Start with this consumer's own pending entries (left by a crash), then new ones.
        self._read_ids = {self._keys.frames(camera): "0" for camera in cameras}
        self._polls = StreamPolls()  # on a cluster: which streams to ask, each time
        self._camera_of = {self._keys.frames(camera): camera for camera in cameras}
        # cameras new to this reader since their last batch: the publisher reads their
        # analytics state from Redis before their frames (another worker may have moved it on)
        self._fresh = set(cameras)

    def claim_pending(self) -> int:
        """Take over the frames another consumer read and never acknowledged (a worker that
        crashed, or had another name in an earlier run), so this worker's own pending read
        sees them; returns how many were claimed.  Each camera has one worker at a time."""
        claimed = 0
        for key, camera in self._camera_of.items():
            try:
                taken, trimmed = claim_pending(self._redis, key, self._context.consumer)
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
        """Read until stopped, failed or (once ``finish`` is set) every camera ended; then dispatch
        what the policy holds, and close the hand-off to the inferer."""
        try:
            self._read_loop()
            self._earlier_runs.finish()
        finally:
            self._outbox.close()

    def _read_loop(self) -> None:
        policy, stop = self._policy, self._lifecycle.stop
        while not self._lifecycle.failed:
            self._apply_changes()
            for size, seconds in self._meter.samples():
                policy.observe(size, seconds)
            if stop.is_set() or (self._finish.is_set() and self._accounting.ended(self._cameras)):
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
            if per_stream >= 1 and self._read_ids and self._handover.may_read():
                self._read(count=per_stream, block_ms=block_ms)
                self._read_quiet_tails()
            elif block_ms is not None:
                stop.wait(block_s)  # full and idle: only a policy that waits on the clock

    def _apply_changes(self) -> None:
        for change in self._changes.take():
            camera, key = change.camera, self._keys.frames(change.camera)
            if change.kind in ("pause", "drop", "forget"):
                self._read_ids.pop(key, None)
                self._handover.release(key)
                if change.kind == "drop":
                    given_up = self._policy.queues.discard(camera)
                    self._accounting.hand_over(
                        camera, [(q.item.message.session, q.item.message.seq) for q in given_up]
                    )
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
                # a camera from the registry may have no group yet (its decoder may not have
                # written to it): a group missing later means Redis lost its data
                ensure_group(self._redis, key)
                self._fresh.add(camera)
                if camera not in self._cameras:
                    self._cameras.append(camera)
                self._read_ids[key] = "0"  # own pending entries first, as at start
                self._camera_of[key] = camera
                self._policy.queues.make_room(len(self._read_ids))
            if change.kind == "adopt" and change.position is not None:
                self._accounting.adopt(camera, change.position)
                self._handover.adopt(key, change.position)
            change.applied.set()

    def _read(self, *, count: int, block_ms: int | None) -> None:
        """XREADGROUP over every camera; ``block_ms=None`` returns at once."""
        try:
            reply = read_streams(
                self._redis,
                self._read_ids,
                group=FRAMES_GROUP,
                consumer=self._context.consumer,
                count=count,
                block_ms=block_ms,
                polls=self._polls,
            )
        except GroupsMissing as exc:  # a cluster node lost its data; the others' reads came
            self._recreate_groups(exc.keys)
            reply = exc.reply
        except redis.ResponseError as exc:
            if not is_nogroup(exc):
                raise
            self._recreate_groups()
            return
        if not self._handover.may_read():
            # the reply came after this worker's leases may have run out (a read held up by an
            # outage): another worker may read these cameras now, and finds the entries
            # pending here when it meets their gap (``CameraHandover.strays``)
            return
        dropped: list[Dropped[PendingFrame]] = []
        read: list[str] = []
        for key, entries in reply or []:
            key = key.decode()
            if not self._handover.leased(self._camera_of[key]):
                # lost in the read (its letting go is on the way): the entries stay pending
                # here, for the camera's holder to claim as it meets their gap
                continue
            if self._read_ids[key] != ">" and not entries:
                self._read_ids[key] = ">"  # own pending history exhausted
                self._handover.history_read(key)
            for entry_id, fields in entries:
                if self._read_ids[key] != ">":
                    self._read_ids[key] = entry_id
                dropped += self._receive(key, entry_id, fields)
            if entries:
                read.append(self._camera_of[key])
        self._handover.record_positions(read)
        self._drop(dropped)

    def _read_quiet_tails(self) -> None:
        """Entries a quiet stream holds pending after its last read (see ``CameraHandover``)."""
        found = self._handover.quiet_tails(self._read_ids, self._camera_of)
        if not found or not self._handover.may_read():
            return
        dropped: list[Dropped[PendingFrame]] = []
        for key, entries in found:
            for entry_id, fields in entries:
                dropped += self._receive_one(key, entry_id, fields)
        self._handover.record_positions([self._camera_of[key] for key, _ in found])
        self._drop(dropped)

    def _acknowledge(self, key: str, ids: list[bytes], entries: list[LedgerEntry]) -> None:
        """Ledger entries the accounting just wrote, and the acknowledgement; with the
        camera's position in the same script when positions are kept (a worker taking
        the camera over must neither miss nor repeat these entries)."""
        position = self._handover.position(self._camera_of[key])
        if not self._acks.acknowledge(key, ids, entries, position=position):
            self._refused({self._camera_of[key]})

    @staticmethod
    def _refused(cameras: set[str]) -> None:
        """Writes refused: another worker took these cameras while this worker's renewal ran
        late (or read them on and let go meanwhile), and counts from the position it adopted
        what was refused here (the lease keeper lets them go, or adopts them again from that
        position, at its next renewal)."""
        for camera in sorted(cameras):
            log.info(
                "camera %s: another worker holds it now, or read it further; what was read of "
                "it here is left to the position kept in Redis",
                camera,
            )

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
            ensure_group(self._redis, key)
            self._read_ids[key] = ">"  # our pending list went with it
        self._accounting.on_redis_lost([self._camera_of[key] for key in keys])

    def _receive(
        self, key: str, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> list[Dropped[PendingFrame]]:
        """Hand one entry to the accounting and the policy, after the frames of the gap before
        it that another worker held; returns what the policy shed."""
        camera = self._camera_of[key]
        dropped: list[Dropped[PendingFrame]] = []
        for stray_id, stray_fields in self._handover.strays(key, camera, entry_id, fields):
            dropped += self._receive_one(key, stray_id, stray_fields)
        return dropped + self._receive_one(key, entry_id, fields)

    def _receive_one(
        self, key: str, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> list[Dropped[PendingFrame]]:
        camera = self._camera_of[key]
        lost = self._handover.lost(key, camera, entry_id, fields)
        if lost is not None:
            self._acknowledge(key, [entry_id], [lost])
            return []
        self._handover.seen(key, entry_id)
        if self._earlier_runs.take(key, camera, entry_id, fields):
            return []
        if message_kind(fields) == "end":
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
        self._earlier_runs.this_run_begins(key, frame.camera, frame.session)
        if not self._count_arrival(key, entry_id, frame):
            return []
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

    def _count_arrival(self, key: str, entry_id: bytes, frame: FrameMessage) -> bool:
        """The frame's arrival, and the gap in ``seq`` before it (dropped frames, written to
        the ledger); False for the same frame again (an XADD retried after a lost reply)."""
        if self._handover.claimed(key, entry_id):
            self._accounting.on_claimed(frame.camera)
            return True
        gaps = self._accounting.on_received(
            frame.camera, frame.seq, frame.session, frame.redis_down
        )
        if gaps is None:
            self._acks.acknowledge(key, [entry_id])
            return False
        if gaps:
            self._acknowledge(key, [], gaps)
        return True

    def _drop(self, dropped: list[Dropped[PendingFrame]]) -> None:
        """Frames the policy shed (stale, superseded, overflow): counted, written to the ledger,
        acknowledged and deleted."""
        if not dropped:
            return
        acks: dict[str, StreamAck] = {}
        for d in dropped:
            message = d.frame.item.message
            key = self._keys.frames(d.frame.camera)
            ack = acks.setdefault(key, StreamAck(key, []))
            ack.entries.append(
                self._accounting.on_shed(message.camera, d.cause, message.session, message.seq)
            )
            ack.ids.append(d.frame.item.entry_id)
        self._refused(self._acks.acknowledge_streams(list(acks.values())))

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
        for indices in batches_by_shape([i.shape for i in images], [q.camera for q in kept]):
            tensor = self._detector.prepare([images[i] for i in indices])
            frames_of_shape = [kept[i] for i in indices]
            fresh = frozenset(q.camera for q in frames_of_shape) & self._fresh
            self._fresh -= fresh
            self._outbox.put(
                PreparedBatch(next(self._batch_ids), frames_of_shape, tensor, batched, fresh)
            )


def batches_by_shape(shapes: list[tuple[int, ...]], cameras: list[str]) -> list[list[int]]:
    """The frames of a dispatch (their images' shapes and cameras, in the dispatch's order)
    as batches of one shape each, in the order they are published: one batch a shape, except
    that a camera's frame never goes in a batch before one holding an earlier frame of that
    camera (a camera whose picture changed size with its session: its detections, and the
    analytics after them, keep the camera's order)."""
    batches: list[tuple[tuple[int, ...], list[int]]] = []
    last_batch: dict[str, int] = {}  # by camera: the batch its latest frame went in
    for index, (shape, camera) in enumerate(zip(shapes, cameras, strict=True)):
        first = last_batch.get(camera, 0)
        at = next((b for b in range(first, len(batches)) if batches[b][0] == shape), None)
        if at is None:
            at = len(batches)
            batches.append((shape, []))
        batches[at][1].append(index)
        last_batch[camera] = at
    return [indices for _shape, indices in batches]
