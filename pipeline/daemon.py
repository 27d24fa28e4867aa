"""The composition root: builds every part of a run from the config and supervises it.

``Pipeline.run`` starts (or connects to) Redis, loads the detector, starts one decode process per
camera and the batcher threads, then supervises until stopped or, in ``until_done`` mode, until
every file source has ended and every decoded frame has its detections published.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field

import redis

from detectors.base import BackendUnavailable
from detectors.detector import Detector
from detectors.preprocess import Letterbox
from pipeline.accounting import Accounting
from pipeline.batch_worker import BatchWorker
from pipeline.builders import (
    batching_policy,
    check_run_mode,
    decode_threads,
    decoder_spec,
    frame_letterbox,
    load_detector,
    run_shape,
    shard_cameras,
    time_batches,
    transport_spec,
)
from pipeline.config import Config
from pipeline.earlier_runs import drain
from pipeline.errors import BadInput, FramebatchError, RedisUnavailable, RunFailed, StageFailed
from pipeline.frame_acks import FrameAcks
from pipeline.stages.lifecycle import is_redis_outage
from pipeline.summary import RunSummary
from pipeline.telemetry import NO_TELEMETRY, GuardedTelemetry, Telemetry
from streams.decode_worker import DecoderSpec, ProcessFlag, run_decoder_process
from streams.embedded_redis import EmbeddedRedis, RedisServerError
from streams.events import EventLog
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import EndOfStream, session_progress
from streams.redis_access import RedisAccessError, check_access
from streams.redis_connect import CONNECT_TIMEOUT_S, connect, is_outage
from streams.shm_ring import remove_segments
from streams.sinks import DetectionSink, SinkContext, open_sinks
from streams.sinks.base import SinkError
from streams.transport import FrameDecoder, host_id
from streams.urls import redact_url

log = logging.getLogger(__name__)

SUPERVISE_TICK_S = 0.2
DECODER_JOIN_S = 5.0
RESTART_BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0  # a decoder up this long has recovered: its restart backoff resets
#: What the lower layers raise for bad input found before the run starts (exit 2).
START_ERRORS = (
    FileNotFoundError,
    ValueError,
    RedisServerError,
    RedisAccessError,
    BackendUnavailable,
    SinkError,
)


def dead_session_end(
    client: redis.Redis, keys: StreamKeys, camera: str, message: str
) -> dict[str, str | int]:
    """The end entry of a decoder that died without writing one, from the progress it kept
    (its session and frame count: frames trimmed after the last one read are then counted);
    frames -1 when it kept none."""
    progress = session_progress(client.hgetall(keys.progress(camera)))
    client.delete(keys.progress(camera))
    if progress is None:
        return EndOfStream(camera, -1, "crashed", message).to_fields()
    session, frames, redis_down = progress
    end = EndOfStream(camera, frames, "crashed", message, session=session, redis_down=redis_down)
    return end.to_fields()


@dataclass
class _Decoder:
    spec: DecoderSpec
    process: multiprocessing.process.BaseProcess
    restarts: int = 0  # since the last healthy period: sets the backoff
    restart_at: float | None = None
    finished: bool = False
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class Pipeline:
    """One run of framebatch. ``run()`` blocks; set ``stop`` (e.g. from a signal) to end it."""

    config: Config
    until_done: bool = False
    on_event: Callable[[dict[str, str]], None] = lambda event: None
    stop: threading.Event = field(default_factory=threading.Event)
    # how the detector is built; the bench passes one that also times each stage
    detector_factory: Callable[[Config, str], Detector] = load_detector
    telemetry: Telemetry = NO_TELEMETRY  # hears of every frame, batch and failure
    redis_url: str = ""
    # the batchers run: from here on a failure is the run's, not the input's
    started: bool = field(default=False, init=False)

    @property
    def _reconnect_timeout_s(self) -> float:
        return self.config.redis.reconnect_timeout_s

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Whatever ends the run, as a ``FramebatchError``: bad input before the batchers
        start (exit 2), a failed run after (exit 3); anything else is a bug (a traceback)."""
        try:
            yield
        except FramebatchError as exc:
            cause = exc.__cause__
            if isinstance(exc, StageFailed) and cause is not None and is_redis_outage(cause):
                raise self._redis_gone(cause) from cause
            raise
        except START_ERRORS as exc:
            if self.started:
                raise
            raise BadInput(redact_url(str(exc))) from exc
        except redis.RedisError as exc:
            if is_outage(exc):
                raise self._redis_gone(exc) from exc
            raise RunFailed(f"the run failed: {redact_url(str(exc))}") from exc

    def _redis_gone(self, exc: BaseException) -> RedisUnavailable:
        where = redact_url(self.config.redis.url or "the private redis-server")
        timeout = self._reconnect_timeout_s
        return RedisUnavailable(
            f"Redis at {where} unreachable for more than {timeout:.0f} s "
            f"(redis.reconnect_timeout_s): {redact_url(str(exc))}"
        )

    def run(self) -> RunSummary:
        """Raises ``BadInput`` (exit 2) or ``RunFailed`` (exit 3) with a one-line message."""
        with self._errors():
            return self._run()

    def _run(self) -> RunSummary:
        check_run_mode(self.config, until_done=self.until_done)
        with ExitStack() as stack:
            self.redis_url = self.config.redis.url or stack.enter_context(EmbeddedRedis()).url
            keys = StreamKeys(self.config.redis.prefix)
            # bad input at start (URL, password, ACL, TLS) is one line and exit 2, at once...
            with closing(
                connect(self.redis_url, reconnect_timeout_s=0, socket_timeout_s=CONNECT_TIMEOUT_S)
            ) as probe:
                check_access(probe, keys, url=self.redis_url)
            # ...while from here on every process rides out a Redis outage
            client = connect(self.redis_url, reconnect_timeout_s=self._reconnect_timeout_s)
            stack.callback(client.close)
            self._prepare_streams(client, keys)
            camera_ids = [camera.id for camera in self.config.cameras]
            telemetry = GuardedTelemetry(self.telemetry)
            accounting = Accounting(
                camera_ids,
                max_batch_size=self.config.batching.max_batch_size,
                telemetry=telemetry,
            )
            sink = open_sinks(
                self.config.sinks,
                SinkContext(client, keys, detections_maxlen=self.config.redis.detections_maxlen),
            )
            stack.callback(sink.close)  # after the batchers stopped writing
            # What an earlier run left, before any decoder of this run can trim it away
            acks = FrameAcks(
                redis_client=client, keys=keys, ledger_maxlen=self.config.redis.detections_maxlen
            )
            drain(client, keys, camera_ids, accounting=accounting, acks=acks)
            events_seen = EventLog(client, keys).last_id()  # report every event of this run
            seconds, micros = client.time()
            since_ms = seconds * 1000 + micros // 1000  # stream entries older than this run
            # Decoders start first: their start-up overlaps the model load and warm-up.
            decoders_stop = ProcessFlag()  # a decoder killed while waiting cannot hang set()
            letterbox = frame_letterbox(self.config)  # square, or rect where the model allows
            self._spawn_args = (letterbox, keys, decoders_stop)
            # shm rings: a decoder's ring outlives it until its frames are read or the batchers
            # have stopped (released); the rings of decoders that died are ours to remove
            self._transport, self._host = transport_spec(self.config), host_id()
            self._released = ProcessFlag()
            remove_segments(keys.prefix, host=self._host)  # left by processes that died
            decoders = self._start_decoders(letterbox, keys, decoders_stop)
            stack.callback(self._remove_rings, keys, decoders)
            stack.callback(self._stop_decoders, decoders, decoders_stop)
            stack.callback(self._released.set)  # runs first, once the batchers have stopped
            devices = self.config.model.worker_devices
            shards = shard_cameras(camera_ids, len(devices))
            batchers: list[threading.Thread] = []
            batcher_stop = threading.Event()
            batcher_error: list[BaseException] = []
            for index, (device, cameras) in enumerate(zip(devices, shards, strict=True)):
                if not cameras:  # more devices than cameras
                    continue
                detector = self.detector_factory(self.config, device)
                stack.callback(detector.close)
                worker = self._batch_worker(
                    client, keys, detector, accounting, sink, telemetry, cameras, index, since_ms
                )
                batchers.append(
                    threading.Thread(
                        target=self._run_batcher,
                        args=(worker, batcher_stop, batcher_error),
                        name=f"fb-batcher-{device}",
                    )
                )
            for batcher in batchers:
                batcher.start()
            self.started = True
            try:
                self._supervise(
                    client,
                    keys,
                    decoders,
                    decoders_stop,
                    batchers,
                    batcher_error,
                    accounting,
                    events_seen,
                )
            finally:
                decoders_stop.set()
                batcher_stop.set()
                for batcher in batchers:
                    batcher.join()
            if batcher_error:
                raise batcher_error[0]
            return accounting.summary()

    # --- building -----------------------------------------------------------------------------
    def _batch_worker(
        self,
        client: redis.Redis,
        keys: StreamKeys,
        detector: Detector,
        accounting: Accounting,
        sink: DetectionSink,
        telemetry: Telemetry,
        cameras: list[str],
        index: int,
        since_ms: int,
    ) -> BatchWorker:
        """One detector worker over its share of the cameras, its policy seeded with t(b)."""
        policy = batching_policy(self.config, until_done=self.until_done)
        sizes = {1, self.config.batching.max_batch_size}
        shape = run_shape(self.config, detector.info)
        for size, seconds in time_batches(detector, sizes, shape):
            policy.observe(size, seconds)  # the policy knows t(b) before the first frame
        return BatchWorker(
            redis_client=client,
            keys=keys,
            cameras=cameras,
            detector=detector,
            policy=policy,
            accounting=accounting,
            sink=sink,
            ledger_maxlen=self.config.redis.detections_maxlen,
            until_done=self.until_done,
            telemetry=telemetry,
            consumer_name=f"batcher-{index}",
            since_ms=since_ms,
            frame_decoder=FrameDecoder(host=self._host),
        )

    def _prepare_streams(self, client: redis.Redis, keys: StreamKeys) -> None:
        # What an earlier run left in a frames stream stays: the batcher acknowledges those
        # entries and counts their frames as previous_run (a replay too), never deletes them
        # unseen, and never processes them as this run's.
        for camera in self.config.cameras:
            key = keys.frames(camera.id)
            try:
                # "0" on a new stream; an existing group keeps its position and pending frames
                client.xgroup_create(key, FRAMES_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def _start_decoders(
        self, letterbox: Letterbox, keys: StreamKeys, stop: ProcessFlag
    ) -> list[_Decoder]:
        decoders = []
        threads = decode_threads(self.config)
        for camera in self.config.cameras:
            spec = decoder_spec(
                camera,
                default_backlog=self.config.redis.frames_maxlen,
                until_done=self.until_done,
                decode_threads=threads,
                # a live camera keeps at most one batch waiting in its stream: beyond that the
                # pipeline is behind, and older frames would only raise the latency
                live_backlog=self.config.batching.max_batch_size,
            )
            decoders.append(_Decoder(spec, self._spawn(spec, letterbox, keys, stop)))
        return decoders

    def _spawn(self, spec, letterbox, keys, stop) -> multiprocessing.process.BaseProcess:
        process = multiprocessing.get_context("spawn").Process(
            target=run_decoder_process,
            args=(
                spec,
                self.redis_url,
                keys.prefix,
                letterbox,
                stop,
                self._transport,
                self._released,
                os.getpid(),  # the decoder dies with this process, however it ends
                self._reconnect_timeout_s,
                letterbox.max_bytes,
            ),
            name=f"fb-decoder-{spec.camera}",
            daemon=True,
        )
        process.start()
        return process

    # --- running ------------------------------------------------------------------------------
    @staticmethod
    def _run_batcher(
        worker: BatchWorker, stop: threading.Event, errors: list[BaseException]
    ) -> None:
        try:
            worker.run(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the supervising thread
            errors.append(exc)

    def _supervise(
        self, client, keys, decoders, decoders_stop, batchers, errors, accounting, last_event
    ) -> None:
        """Until stopped, a worker fails, or (``until_done``) every worker finished its
        cameras: a worker done with its own cameras must not stop the others."""
        events = EventLog(client, keys)
        file_cameras = [d.spec.camera for d in decoders if not d.spec.live]
        while (
            any(b.is_alive() for b in batchers)
            and not errors
            and not self.stop.wait(SUPERVISE_TICK_S)
        ):
            last_event = self._report_events(events, last_event)
            self._check_decoders(client, keys, decoders, decoders_stop)
            if self.until_done and accounting.ended(file_cameras):
                decoders_stop.set()  # files are done: live cameras stop and end too
        self._report_events(events, last_event)
        if self.stop.is_set():
            log.info("stopping: finishing the batch in flight")

    def _report_events(self, events: EventLog, last_event: str) -> str:
        for event_id, event in events.read_after(last_event):
            last_event = event_id
            self.on_event(event)
        return last_event

    def _check_decoders(self, client, keys, decoders, decoders_stop) -> None:
        now = time.monotonic()
        for decoder in decoders:
            if decoder.finished:
                continue
            process = decoder.process
            if process.is_alive():
                if decoder.restarts and now - decoder.started_at >= HEALTHY_AFTER_S:
                    decoder.restarts = 0  # a crash after a healthy spell starts at 1 s again
                continue
            if decoder.restart_at is not None:
                if now >= decoder.restart_at and not decoders_stop.is_set():
                    decoder.process = self._spawn(decoder.spec, *self._spawn_args)
                    decoder.restart_at, decoder.started_at = None, now
                continue
            remove_segments(keys.prefix, host=self._host, pids=[process.pid])  # a dead one's ring
            if process.exitcode == 0:
                decoder.finished = True
                continue
            # Died without its end entry (segfault, OOM kill...): say so, and restart live cameras.
            camera, code = decoder.spec.camera, process.exitcode
            message = f"decoder process for camera {camera!r} died (exit code {code})"
            EventLog(client, keys).emit(decoder.spec.camera, "crashed", message)
            # a camera, or a clip looped like one, comes back; a finite file job does not
            # (its frames would be decoded again)
            client.xadd(keys.frames(camera), dead_session_end(client, keys, camera, message))
            if (decoder.spec.live or decoder.spec.loop) and not self.until_done:
                decoder.restarts += 1
                delay = min(2.0**decoder.restarts, RESTART_BACKOFF_MAX_S)
                decoder.restart_at = now + delay
            else:
                decoder.finished = True

    def _remove_rings(self, keys: StreamKeys, decoders: list[_Decoder]) -> None:
        """After the decoders stopped: the rings of any that were killed on the way out."""
        remove_segments(keys.prefix, host=self._host, pids=[d.process.pid for d in decoders])

    @staticmethod
    def _stop_decoders(decoders: list[_Decoder], stop: ProcessFlag) -> None:
        """stop event → join(timeout) → terminate → kill: never leaves a decoder behind."""
        stop.set()
        deadline = time.monotonic() + DECODER_JOIN_S
        for decoder in decoders:
            decoder.process.join(max(0.0, deadline - time.monotonic()))
        for decoder in decoders:
            if decoder.process.is_alive():
                decoder.process.terminate()
                decoder.process.join(2.0)
            if decoder.process.is_alive():
                decoder.process.kill()
                decoder.process.join()
