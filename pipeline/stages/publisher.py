"""The publisher stage: post-processes each inferred batch (box decoding, NMS), runs each
camera's analytics (tracks, zones, lines: :mod:`pipeline.analytics`) in the camera's frame order,
writes one detection message per frame to the sinks, then acknowledges the frames with the
analytics' events and state — in that order, so a crash in between repeats a message (consumers
de-duplicate by ``frame_id``), never loses one, and analyses those frames again from the state
before them."""

from __future__ import annotations

import logging

from detectors.detector import Detector
from detectors.postprocess import ImageDetections
from detectors.preprocess import LetterboxGeometry
from pipeline.analytics.snapshots import FramePicture
from pipeline.analytics.stage import FrameAnalyser
from pipeline.ledger.acks import AnalyticsWrite
from pipeline.stages.batches import InferredBatch
from pipeline.stages.context import WorkerContext
from pipeline.stages.lifecycle import Handoff
from pipeline.telemetry import DetectedFrame
from streams.messages import Detection, DetectionMessage, FrameMessage, Timestamps
from streams.sinks import DetectionSink

log = logging.getLogger(__name__)


class Publisher:
    def __init__(
        self,
        context: WorkerContext,
        *,
        detector: Detector,
        inbox: Handoff[InferredBatch],
        sink: DetectionSink,
        analyser: FrameAnalyser | None = None,
        events_maxlen: int = 100_000,
    ):
        """``analyser``: the cameras' analytics (None: no camera has any)."""
        self._detector = detector
        self._analyser = analyser
        self._events_maxlen = events_maxlen
        self._telemetry = context.telemetry
        self._inbox = inbox
        self._sink = sink
        self._acks = context.acks
        self._keys = context.keys
        self._accounting = context.accounting
        self._clock = context.clock

    def run(self) -> None:
        """Publish batches in the order the reader dispatched them (instances of the detector
        may finish them out of order; a camera's detections keep their order)."""
        finished: dict[int, InferredBatch] = {}
        next_id = 0
        for batch in self._inbox:
            finished[batch.prepared.batch_id] = batch
            while next_id in finished:
                self.publish(finished.pop(next_id))
                next_id += 1

    def publish(self, batch: InferredBatch) -> None:
        frames = batch.prepared.frames
        messages = [q.item.message for q in frames]
        geometries = [
            LetterboxGeometry(m.width, m.height, m.scale, m.pad_x, m.pad_y) for m in messages
        ]
        results = self._detector.postprocess(batch.output, geometries)
        published = self._clock()
        detections = [
            self._detection_message(batch, message, result, published)
            for message, result in zip(messages, results, strict=True)
        ]
        writes: dict[str, AnalyticsWrite] = {}
        if self._analyser is not None:
            pictures = [
                FramePicture(q.item.image, geometry)
                for q, geometry in zip(frames, geometries, strict=True)
            ]
            analysed = self._analyser.analyse(detections, batch.prepared.fresh, pictures)
            detections = analysed.messages
            writes = {
                camera: AnalyticsWrite([e.to_fields() for e in commit.events], commit.state)
                for camera, commit in analysed.commits.items()
            }
        by_stream: dict[str, list[bytes]] = {}
        for q in frames:
            by_stream.setdefault(self._keys.frames(q.camera), []).append(q.item.entry_id)
        try:
            self._sink.write(detections)
            acked = self._acks.acknowledge_frames(
                by_stream, writes, events_maxlen=self._events_maxlen
            )
        except BaseException:
            if self._analyser is not None:  # its next frames start from the state in Redis
                self._analyser.forget(writes)
            raise
        if writes:
            refused = acked.refused
            # a camera whose lease moved on: its new owner analyses these frames again; one
            # whose state in Redis is of newer frames: its next frames start from that one
            self._analyser.forget(refused | acked.superseded)  # type: ignore[union-attr]
            for camera in sorted(acked.superseded):
                log.warning(
                    "camera %s: analytics state in Redis is of newer frames than this batch's "
                    "(written by another worker meanwhile, or a batch published out of the "
                    "camera's order): their events written, that state kept",
                    camera,
                )
            self._telemetry.objects_analysed(
                [e for camera in writes.keys() - refused for e in analysed.commits[camera].events]
            )
            for camera, occupancy in analysed.occupancy.items():
                if camera in refused:  # its owner's gauges count it now
                    occupancy = {zone: {} for zone in occupancy}
                self._telemetry.zones_occupied(camera, occupancy)
        batched = batch.prepared.batched
        for q, geometry, result, message in zip(
            frames, geometries, results, detections, strict=True
        ):
            tracked = message if self._analyser is not None else None
            used = analysed.settings.get(q.camera) if self._analyser is not None else None
            seen = DetectedFrame(q.seq, q.item.image, geometry, result, tracked, used)
            self._telemetry.frame_detected(q.camera, message.timestamps, seen)
        # counted last: once a camera's frames are all counted, none is still on its way here
        self._accounting.on_published(
            [(m.camera, published - m.captured, batched - m.enqueued) for m in messages],
            published,
        )

    def _detection_message(
        self,
        batch: InferredBatch,
        message: FrameMessage,
        result: ImageDetections,
        published: float,
    ) -> DetectionMessage:
        label = self._detector.info.label
        # rounded as the wire rounds them: analytics sees what every consumer reads
        detections = tuple(
            Detection(
                tuple(round(float(v), 2) for v in box),
                round(float(score), 5),
                int(cls),
                label(int(cls)),
            )
            for box, score, cls in zip(result.boxes, result.scores, result.class_ids, strict=True)
        )
        return DetectionMessage(
            camera=message.camera,
            session=message.session,
            seq=message.seq,
            pts=message.pts,
            width=message.width,
            height=message.height,
            batch_id=batch.prepared.batch_id,
            batch_size=len(batch.prepared.frames),
            detections=detections,
            timestamps=Timestamps(
                captured=message.captured,
                enqueued=message.enqueued,
                batched=batch.prepared.batched,
                inferred=batch.inferred,
                published=published,
            ),
        )
