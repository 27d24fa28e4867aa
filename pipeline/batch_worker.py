"""The batcher/detector loop: frames streams → batching policy → detector → detections streams.

Three stages on three threads so the detector is never idle while work is queued:

* reader (the caller's thread): ``XREADGROUP`` over every camera, feeds the policy, and when the
  policy dispatches, gets each frame's pixels out of its transport (``FrameDecoder``: inline,
  JPEG or shared memory; a frame lost in transport drops with its cause) and prepares the
  batch (``Detector.prepare``);
* inference: runs the backend on prepared batches (ONNX Runtime releases the GIL);
* publisher: post-processes (decode + NMS), ``XADD``s one detection message per frame, then
  ``XACK`` + ``XDEL``s the frames — in that order, in one round trip.

The hand-off queues hold one batch each, so at most three batches are in memory at once.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from detectors.detector import Detector
from detectors.postprocess import ImageDetections
from detectors.preprocess import LetterboxGeometry
from pipeline.accounting import Accounting
from pipeline.batching import BatchPolicy, Dropped, Queued
from pipeline.earlier_runs import EarlierRuns, claim_pending
from pipeline.frame_acks import FrameAcks
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import (
    Detection,
    DetectionMessage,
    EndOfStream,
    FrameMessage,
    Timestamps,
    message_kind,
)
from streams.redis_connect import is_nogroup
from streams.transport import FrameDecoder, TransportLost

log = logging.getLogger(__name__)

IDLE_BLOCK_MS = 100
_DONE = object()  # end-of-work marker passed down the stage queues


@dataclass(frozen=True)
class PendingFrame:
    entry_id: bytes
    message: FrameMessage
    image: np.ndarray | None = None  # pixels already out of their transport (shm), if any


@dataclass(frozen=True)
class PreparedBatch:
    batch_id: int
    frames: list[Queued[PendingFrame]]
    tensor: Any
    batched: float


@dataclass(frozen=True)
class InferredBatch:
    prepared: PreparedBatch
    raw: np.ndarray
    inferred: float


class StageFailed(RuntimeError):
    """An inference or publishing thread died; the reader stops instead of blocking forever."""


class BatchWorker:
    """Runs the three stages until ``stop`` is set, or until every camera ended (``until_done``)."""

    def __init__(
        self,
        *,
        redis_client: redis.Redis,
        keys: StreamKeys,
        cameras: list[str],
        detector: Detector,
        policy: BatchPolicy[PendingFrame],
        accounting: Accounting,
        detections_maxlen: int,
        until_done: bool,
        frame_decoder: FrameDecoder | None = None,
        consumer_name: str = "batcher-0",
        since_ms: int = 0,
        clock: Callable[[], float] = time.time,
    ):
        """``since_ms``: Redis time at which this run began; older entries are an earlier run's.
        ``frame_decoder``: reads pixels of every transport; the worker closes it when it ends."""
        self._redis = redis_client
        self._keys = keys
        self._cameras = cameras
        self._detector = detector
        self._policy = policy
        self._accounting = accounting
        self._detections_maxlen = detections_maxlen
        self._until_done = until_done
        self._frames = frame_decoder or FrameDecoder()
        self._consumer = consumer_name
        self._earlier_runs = EarlierRuns(
            redis_client=redis_client, keys=keys, accounting=accounting
        )
        self._acks = FrameAcks(
            redis_client=redis_client, keys=keys, ledger_maxlen=detections_maxlen
        )
        self._since_ms = since_ms
        self._clock = clock
        self._batch_ids = itertools.count()
        self._to_infer: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._to_publish: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._failure: BaseException | None = None
        # (batch size, seconds) of finished inferences, handed from the inference thread to the
        # reader, which alone touches the policy
        self._service_times: queue.SimpleQueue[tuple[int, float]] = queue.SimpleQueue()
        self._slot_freed = threading.Event()  # the inference thread took the prepared batch
        self._running: tuple[float, int] | None = None  # (perf_counter at start, size) of inference
        # Start with this consumer's own pending entries (left by a crash), then new ones.
        self._read_ids = {keys.frames(camera): "0" for camera in cameras}
        self._camera_of = {keys.frames(camera): camera for camera in cameras}

    # --- reader -----------------------------------------------------------------------------
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
                self._recreate_groups()  # Redis restarted empty while the model loaded
                continue
            claimed += taken
            if trimmed:
                self._earlier_runs.trimmed(camera)
        return claimed

    def run(self, stop: threading.Event) -> None:
        """Serve until stopped or done; always finishes and publishes the batches in flight."""
        self.claim_pending()
        stages = [
            threading.Thread(target=self._guard, args=(self._infer_loop,), name="fb-infer"),
            threading.Thread(target=self._guard, args=(self._publish_loop,), name="fb-publish"),
        ]
        for thread in stages:
            thread.start()
        try:
            self._read_loop(stop)
            for camera in self._earlier_runs.unsettled_cameras():  # no frame of this run came
                holes = self._earlier_runs.settle(camera, set())
                self._acks.acknowledge(self._keys.frames(camera), [], holes)
        finally:
            self._put(self._to_infer, _DONE)
            for thread in stages:
                thread.join()
            self._frames.close()
        if self._failure is not None:
            raise StageFailed(f"batcher stage failed: {self._failure!r}") from self._failure

    def _read_loop(self, stop: threading.Event) -> None:
        policy = self._policy
        while self._failure is None:
            while not self._service_times.empty():
                policy.observe(*self._service_times.get())
            if stop.is_set() or (self._until_done and self._accounting.ended(self._cameras)):
                # stopping, or nothing more can arrive: what was read is in flight, finish it
                for batch in policy.flush():
                    self._dispatch(batch)
                return
            now = self._clock()
            idle = self._to_infer.empty()  # the detector can take the next batch
            decision = policy.poll(now, idle=idle, start_delay_s=self._busy_for())
            self._drop(decision.dropped)
            if decision.batch:
                self._dispatch(decision.batch)
                continue
            wake_at = decision.wake_at
            block_s = IDLE_BLOCK_MS / 1000 if wake_at is None else max(wake_at - now, 0.001)
            if policy.waiting and not idle:
                # a batch waits for the detector: only its taking the prepared one lets us
                # dispatch, so sleep until then, and read what arrived meanwhile at once
                self._slot_freed.wait(IDLE_BLOCK_MS / 1000)
                self._slot_freed.clear()
                block_ms = None
            else:
                block_ms = max(1, int(block_s * 1000))
            # COUNT applies per stream: read only what cannot overflow the policy's queues
            per_stream = (policy.queues.max_waiting - policy.waiting) // len(self._read_ids)
            if per_stream >= 1:
                self._read(count=per_stream, block_ms=block_ms)
            elif block_ms is not None:
                stop.wait(block_s)  # full and idle: only a policy that waits on the clock

    def _busy_for(self) -> float:
        """Expected seconds until the running inference ends (0 when the detector is free)."""
        running = self._running
        if running is None:
            return 0.0
        started, size = running
        return max(0.0, started + self._policy.service.estimate(size) - time.perf_counter())

    def _read(self, *, count: int, block_ms: int | None) -> None:
        """XREADGROUP over every camera; ``block_ms=None`` returns at once."""
        try:
            reply = self._redis.xreadgroup(
                FRAMES_GROUP, self._consumer, self._read_ids, count=count, block=block_ms
            )
        except redis.ResponseError as exc:
            if not is_nogroup(exc):
                raise
            self._recreate_groups()
            return
        dropped: list[Dropped[PendingFrame]] = []
        for key, entries in reply or []:
            key = key.decode()
            if self._read_ids[key] != ">" and not entries:
                self._read_ids[key] = ">"  # own pending history exhausted
            for entry_id, fields in entries:
                if self._read_ids[key] != ">":
                    self._read_ids[key] = entry_id
                dropped += self._receive(key, entry_id, fields)
        self._drop(dropped)

    def _recreate_groups(self) -> None:
        """Redis restarted without its data: the streams and the group are gone.  Make the
        group again from the start of each stream (decoders may have re-created a stream
        already) and count the frames Redis lost at each camera's next gap."""
        log.warning(
            "Redis lost its data (a restart without persistence?): consumer group re-created; "
            "frames it held are counted as redis_lost"
        )
        for key in self._read_ids:
            try:
                self._redis.xgroup_create(key, FRAMES_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._read_ids[key] = ">"  # our pending list went with it
        self._accounting.on_redis_lost(self._cameras)

    def _receive(
        self, key: str, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> list[Dropped[PendingFrame]]:
        """Hand one entry to the accounting and the policy; returns what the policy shed.
        Whatever it reveals as dropped goes into the camera's ledger before the entry is
        acknowledged."""
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
            )
            self._acks.acknowledge(key, [entry_id], entries)
            return []
        frame = FrameMessage.from_fields(fields)
        if self._earlier_runs.unsettled(frame.camera):
            # this run's first frame: the earlier run's entries (older) are all read
            holes = self._earlier_runs.settle(self._camera_of[key], {frame.session})
            self._acks.acknowledge(key, [], holes)
        gaps = self._accounting.on_received(
            frame.camera, frame.seq, frame.session, frame.redis_down
        )
        if gaps is None:  # the same frame again: a decoder's XADD retried after a lost reply
            self._acks.acknowledge(key, [entry_id])
            return []
        if gaps:
            self._acks.acknowledge(key, [], gaps)
        try:
            # pixels kept outside Redis are copied out now: a frame may wait in the batching
            # queue longer than its writer takes to come round its ring again
            image = self._frames.detach(frame)
        except TransportLost as exc:
            entry = self._accounting.on_shed(frame.camera, exc.cause, frame.session, frame.seq)
            self._acks.acknowledge(key, [entry_id], [entry])
            return []
        pending = PendingFrame(entry_id, frame, image)
        return self._policy.add(frame.camera, frame.seq, frame.captured, pending, self._clock())

    def _drop(self, dropped: list[Dropped[PendingFrame]]) -> None:
        """Frames the policy shed (stale, superseded, overflow): counted, written to the ledger,
        acknowledged and deleted."""
        if not dropped:
            return
        pipe = self._acks.pipeline()
        entries = []
        for d in dropped:
            message = d.frame.item.message
            entries.append(
                self._accounting.on_shed(message.camera, d.cause, message.session, message.seq)
            )
        self._acks.write_ledger(pipe, entries)
        for d in dropped:
            self._acks.ack_and_delete(
                pipe, self._keys.frames(d.frame.camera), [d.frame.item.entry_id]
            )
        self._acks.execute(pipe)

    def _dispatch(self, frames: list[Queued[PendingFrame]]) -> None:
        batched = self._clock()
        images, kept, lost = [], [], []
        for q in frames:
            try:
                image = q.item.image
                images.append(image if image is not None else self._frames.image(q.item.message))
                kept.append(q)
            except TransportLost as exc:  # counted, acknowledged and deleted like any drop
                lost.append(Dropped(q, exc.cause))
        self._drop(lost)
        if kept:
            tensor = self._detector.prepare(images)
            self._put(self._to_infer, PreparedBatch(next(self._batch_ids), kept, tensor, batched))

    def _put(self, stage: queue.Queue[Any], item: Any) -> None:
        """Blocking put that gives up when a stage has died."""
        while True:
            try:
                stage.put(item, timeout=0.1)
                return
            except queue.Full:
                if self._failure is not None:
                    return

    def _get(self, stage: queue.Queue[Any]) -> Any:
        """Blocking get that ends the stage (``_DONE``) when another stage has died, so a
        failure never leaves a thread waiting for an item that cannot come."""
        while True:
            try:
                return stage.get(timeout=0.1)
            except queue.Empty:
                if self._failure is not None:
                    return _DONE

    # --- inference and publishing ---------------------------------------------------------------
    def _guard(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as exc:  # noqa: BLE001 - recorded and re-raised by run()
            log.exception("batcher stage failed")
            self._failure = exc

    def _infer_loop(self) -> None:
        try:
            while (item := self._get(self._to_infer)) is not _DONE:
                self._slot_freed.set()
                started = time.perf_counter()
                self._running = (started, len(item.frames))
                raw = self._detector.infer(item.tensor)
                self._running = None
                self._service_times.put((len(item.frames), time.perf_counter() - started))
                self._put(self._to_publish, InferredBatch(item, raw, self._clock()))
        finally:
            self._put(self._to_publish, _DONE)

    def _publish_loop(self) -> None:
        while (item := self._get(self._to_publish)) is not _DONE:
            frames = item.prepared.frames
            messages = [q.item.message for q in frames]
            geometries = [
                LetterboxGeometry(m.width, m.height, m.scale, m.pad_x, m.pad_y) for m in messages
            ]
            results = self._detector.postprocess(item.raw, geometries)
            published = self._clock()
            pipe = self._acks.pipeline()
            for message, result in zip(messages, results, strict=True):
                detection = self._detection_message(item, message, result, published)
                pipe.xadd(
                    self._keys.detections(message.camera),
                    detection.to_fields(),
                    maxlen=self._detections_maxlen,
                    approximate=True,
                )
            # Published first, acknowledged after: a crash in between re-delivers, never loses.
            by_stream: dict[str, list[bytes]] = {}
            for q in frames:
                by_stream.setdefault(self._keys.frames(q.camera), []).append(q.item.entry_id)
            for key, ids in by_stream.items():
                self._acks.ack_and_delete(pipe, key, ids)
            self._acks.execute(pipe)
            batched = item.prepared.batched
            self._accounting.on_published(
                [(m.camera, published - m.captured, batched - m.enqueued) for m in messages],
                published,
            )

    def _detection_message(
        self, item: InferredBatch, message: FrameMessage, result: ImageDetections, published: float
    ) -> DetectionMessage:
        label = self._detector.info.label
        detections = tuple(
            Detection(tuple(float(v) for v in box), float(score), int(cls), label(int(cls)))
            for box, score, cls in zip(result.boxes, result.scores, result.class_ids, strict=True)
        )
        return DetectionMessage(
            camera=message.camera,
            session=message.session,
            seq=message.seq,
            pts=message.pts,
            width=message.width,
            height=message.height,
            batch_id=item.prepared.batch_id,
            batch_size=len(item.prepared.frames),
            detections=detections,
            timestamps=Timestamps(
                captured=message.captured,
                enqueued=message.enqueued,
                batched=item.prepared.batched,
                inferred=item.inferred,
                published=published,
            ),
        )
