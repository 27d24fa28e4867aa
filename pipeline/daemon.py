"""The composition root: builds every part of a run from the config and supervises it.

``Pipeline.run`` starts (or connects to) Redis, loads the detector, starts one decode process per
camera and the batcher threads, then supervises until stopped or, in ``until_done`` mode, until
every file source has ended and every decoded frame has its detections published.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from detectors.base import BackendUnavailable
from detectors.detector import Detector
from pipeline.batching import CameraRules
from pipeline.config import MAX_CAMERAS_PER_DAEMON, CameraConfig, Config
from pipeline.config.errors import ConfigError, format_validation_errors
from pipeline.errors import BadInput, FramebatchError, RedisUnavailable, RunFailed, StageFailed
from pipeline.leases.camera_leases import CameraLeases, lease_probes, worker_alive
from pipeline.leases.keeper import LeaseKeeper
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.ledger.earlier_runs import drain
from pipeline.ledger.summary import RunSummary
from pipeline.serve.control import CameraConflict, CameraNotFound, CameraStates, CameraView, Control
from pipeline.serve.http import HttpServer, bind, build_app
from pipeline.serve.live_view import LiveFrames
from pipeline.serve.metrics import PrometheusTelemetry, StateCollector
from pipeline.stages.lifecycle import is_redis_outage
from pipeline.stages.worker import BatchWorker
from pipeline.supervisor.builders import (
    batching_policy,
    camera_rules,
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
from pipeline.telemetry import NO_TELEMETRY, GuardedTelemetry, Telemetry
from streams.decode_worker import DecoderSpec, ProcessFlag, run_decoder_process
from streams.embedded_redis import EmbeddedRedis, RedisServerError
from streams.events import EventLog
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import EndOfStream, session_progress
from streams.redis_access import RedisAccessError, check_access, describe_redis_error
from streams.redis_cluster import server_time_ms
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
    stop: ProcessFlag  # this decoder's own: a camera removed live stops alone
    process: multiprocessing.process.BaseProcess
    worker: BatchWorker | None = None
    removing: bool = False  # removed through the API: drains, never restarts
    kill_at: float | None = None  # removing: killed if still running then
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
    # where relative file paths of cameras added through the API are resolved (the config's
    # folder, as for the config's own cameras)
    config_dir: Path = field(default_factory=Path.cwd)
    serve_http: bool = True  # the HTTP endpoint of http.listen (benchmarks leave it off)
    # "all": decoders and detector workers (framebatch run); "decode": decoders only;
    # "detect": one detector worker, its cameras taken through leases (pipeline.leases)
    role: str = "all"
    device: str | None = None  # detect: the worker's device (default: the config's first)
    worker_id: str | None = None  # detect: unique among the workers (default: host-pid-random)
    # the batchers run: from here on a failure is the run's, not the input's
    started: bool = field(default=False, init=False)
    http_url: str | None = field(default=None, init=False)  # once serving
    # cameras removed through the API (and not added again): whatever ended them, they do not
    # decide the run's exit status
    removed: set[str] = field(default_factory=set, init=False)

    @property
    def control(self) -> Control | None:
        """What the HTTP API sees of the run, once it has started."""
        return getattr(self, "_control", None)

    def failed_cameras(self) -> list[str]:
        """Cameras whose source failed (and was not restarted), as their decoders reported:
        what ``framebatch decode`` knows of its cameras' end (the frames' fate is in the
        detector workers' summaries)."""
        control = self.control
        states = control.states.states() if control is not None else {}
        return sorted(camera for camera, state in states.items() if state == "failed")

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
        if self.role != "all" and not self.config.redis.url:
            raise BadInput(
                f"framebatch {self.role} needs redis.url: the Redis its decoders and detector "
                "workers share (without it each process would start a private one)"
            )
        with ExitStack() as stack:
            listen = self.config.http.listen if self.serve_http and self.role != "decode" else None
            http_socket = self._bind_http(listen) if listen else None
            if http_socket is not None:
                stack.callback(http_socket.close)
            self.redis_url = self.config.redis.url or stack.enter_context(EmbeddedRedis()).url
            keys = StreamKeys(self.config.redis.prefix)
            # bad input at start (URL, password, ACL, TLS) is one line and exit 2, at once...
            try:  # a cluster client reads the slot map at once
                probe = self._connect(reconnect_timeout_s=0, socket_timeout_s=CONNECT_TIMEOUT_S)
            except redis.RedisError as exc:
                raise RedisAccessError(describe_redis_error(exc, self.redis_url)) from None
            with closing(probe):
                more = lease_probes if self.role == "detect" else None
                check_access(probe, keys, url=self.redis_url, more=more)
            # ...while from here on every process rides out a Redis outage
            client = self._connect(reconnect_timeout_s=self._reconnect_timeout_s)
            stack.callback(client.close)
            self._prepare_streams(client, keys)
            camera_ids = [camera.id for camera in self.config.cameras]
            registry = CollectorRegistry()
            metrics, live = PrometheusTelemetry(registry), LiveFrames()
            exporters = (metrics, live) if http_socket is not None else (metrics,)
            telemetry = GuardedTelemetry(self.telemetry, *exporters)
            accounting = Accounting(
                camera_ids,
                max_batch_size=self.config.batching.max_batch_size,
                telemetry=telemetry,
            )
            states = CameraStates()
            status_client = self._connect(  # probes and scrapes must not ride out an outage
                reconnect_timeout_s=0, socket_timeout_s=CONNECT_TIMEOUT_S
            )
            stack.callback(status_client.close)
            control = Control(
                accounting=accounting,
                states=states,
                redis_client=status_client,
                keys=keys,
                # a tick may wait out a Redis outage: not a dead supervisor
                max_silence_s=self._reconnect_timeout_s + 10,
            )
            stack.callback(control.stopped)
            self._control, self._metrics, self._live = control, metrics, live
            for camera in self.config.cameras:
                states.add(camera.id, camera.url, camera.priority, camera.is_live)
                metrics.add_camera(camera.id)
            gpus = [int(d.split(":")[1]) for d in self.config.model.worker_devices if ":" in d]
            registry.register(StateCollector(control, metrics.utilization, gpus))
            sink = open_sinks(
                self.config.sinks,
                SinkContext(client, keys, detections_maxlen=self.config.redis.detections_maxlen),
            )
            stack.callback(sink.close)  # after the batchers stopped writing
            # What an earlier run left, before any decoder of this run can trim it away
            acks = FrameAcks(
                redis_client=client, keys=keys, ledger_maxlen=self.config.redis.detections_maxlen
            )
            if self.role == "all":  # split roles: leftovers are any detector worker's to read
                drain(client, keys, camera_ids, accounting=accounting, acks=acks)
            self._accounting, self._acks = accounting, acks  # cameras added live are drained too
            events_seen = EventLog(client, keys).last_id()  # report every event of this run
            since_ms = server_time_ms(client)  # stream entries older than this run
            if self.role == "detect":
                since_ms = 0  # workers come and go: every entry is for whoever reads it
            # Decoders start first: their start-up overlaps the model load and warm-up.
            self._stopping = threading.Event()  # no decoder restarts from here on
            if self.role != "detect":  # the decoders letterbox: square, or rect if the model allows
                self._spawn_args = (frame_letterbox(self.config), keys)
            self._sessions: Counter[str] = Counter()  # decoder processes started per camera
            self._client, self._keys = client, keys
            # shm rings: a decoder's ring outlives it until its frames are read or the batchers
            # have stopped (released); the rings of decoders that died are ours to remove
            self._transport, self._host = transport_spec(self.config), host_id()
            self._released = ProcessFlag()
            remove_segments(keys.prefix, host=self._host)  # left by processes that died
            decoders = self._decoders = self._start_decoders() if self.role != "detect" else {}
            stack.callback(self._remove_rings, keys, decoders)
            stack.callback(self._stop_decoders, decoders)
            stack.callback(self._released.set)  # runs first, once the batchers have stopped
            self._label: Callable[[int], str] = str  # class names once the model is loaded
            if http_socket is not None:
                server = HttpServer(self._http_app(registry, control, live), http_socket)
                server.start()
                stack.callback(server.close)
                self.http_url = server.url
            devices = self.config.model.worker_devices
            shards = shard_cameras(camera_ids, len(devices))
            if self.role == "decode":
                devices, shards = [], []
            elif self.role == "detect":  # no cameras yet: the leases deal them
                devices, shards = [self.device or devices[0]], [[]]
            self._keeper: LeaseKeeper | None = None
            batchers: list[threading.Thread] = []
            self._workers: list[BatchWorker] = []
            batcher_stop = threading.Event()
            batcher_error: list[BaseException] = []
            for index, (device, cameras) in enumerate(zip(devices, shards, strict=True)):
                if not cameras and self.role == "all":  # more devices than cameras
                    continue
                detector = self.detector_factory(self.config, device)
                stack.callback(detector.close)
                worker = self._batch_worker(
                    client, keys, detector, accounting, sink, telemetry, cameras, index, since_ms
                )
                self._workers.append(worker)
                if self.role == "detect":
                    # the same id restarted (a pod's container) waits out its old heartbeat;
                    # one that is still renewed belongs to another running worker
                    deadline = time.monotonic() + self.config.redis.lease_ttl_s + 1
                    while worker_alive(client, keys, self._worker_id) and (
                        time.monotonic() < deadline
                    ):
                        self.stop.wait(0.25)
                    if worker_alive(client, keys, self._worker_id):
                        raise BadInput(
                            f"worker id {self._worker_id!r} is in use by a running detector "
                            "worker: give each worker its own --worker-id"
                        )
                    self._keeper = self._lease_keeper(client, keys, worker, accounting, acks)
                    worker.may_read = self._keeper.may_read
                for camera in cameras:
                    decoders[camera].worker = worker
                self._label = detector.info.label
                batchers.append(
                    threading.Thread(
                        target=self._run_batcher,
                        args=(worker, batcher_stop, batcher_error),
                        name=f"fb-batcher-{device}",
                    )
                )
            metrics.configure(
                max_batch_size=self.config.batching.max_batch_size,
                instances=sum(w.instances for w in self._workers),
            )
            for batcher in batchers:
                batcher.start()
            self.started = True
            control.ready.set()
            try:
                self._supervise(client, keys, batchers, batcher_error, accounting, events_seen)
            finally:
                control.stopped()
                self._stop_all(decoders)
                batcher_stop.set()
                for batcher in batchers:
                    while batcher.is_alive():
                        batcher.join(SUPERVISE_TICK_S)
                        if self._keeper is not None:  # its cameras stay its own meanwhile
                            self._keeper.keep_alive()
                if self._keeper is not None and not batcher_error:
                    self._keeper.leave()  # every frame read is finished: the others take over
            if batcher_error:
                raise batcher_error[0]
            return accounting.summary()

    def abandon(self) -> None:
        """Exiting at once (a second signal): the shm rings of decoders that died before the
        supervisor's next tick would find them go now (a live decoder unlinks its own ring
        when it sees its daemon gone)."""
        host = getattr(self, "_host", None)
        if host is not None:
            remove_segments(self.config.redis.prefix, host=host)

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
            consumer_name=self._worker_id if self.role == "detect" else f"batcher-{index}",
            since_ms=since_ms,
            track_positions=self.role == "detect",
            frame_decoder=FrameDecoder(host=self._host),
        )

    @property
    def _worker_id(self) -> str:
        """A detector worker's name in the consumer group and the leases: unique per process."""
        if self.worker_id is None:
            self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        return self.worker_id

    def _lease_keeper(
        self,
        client: redis.Redis,
        keys: StreamKeys,
        worker: BatchWorker,
        accounting: Accounting,
        acks: FrameAcks,
    ) -> LeaseKeeper:
        leases = CameraLeases(
            client,
            keys,
            self._worker_id,
            [camera.id for camera in self.config.cameras],
            ttl_s=self.config.redis.lease_ttl_s,
        )
        rules = {camera.id: self._rules(camera) for camera in self.config.cameras}
        return LeaseKeeper(
            leases=leases,
            changes=worker.changes,
            redis_client=client,
            keys=keys,
            accounting=accounting,
            acks=acks,
            consumer=self._worker_id,
            rules=rules.__getitem__,
        )

    def _connect(self, **options: Any) -> redis.Redis:
        return connect(self.redis_url, cluster=self.config.redis.cluster, **options)

    def _prepare_streams(self, client: redis.Redis, keys: StreamKeys) -> None:
        for camera in self.config.cameras:
            self._prepare_stream(client, keys, camera.id)

    @staticmethod
    def _prepare_stream(client: redis.Redis, keys: StreamKeys, camera: str) -> None:
        # What an earlier run left in a frames stream stays: the batcher acknowledges those
        # entries and counts their frames as previous_run (a replay too), never deletes them
        # unseen, and never processes them as this run's.
        try:
            # "0" on a new stream; an existing group keeps its position and pending frames
            client.xgroup_create(keys.frames(camera), FRAMES_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _start_decoders(self) -> dict[str, _Decoder]:
        return {camera.id: self._start_decoder(camera) for camera in self.config.cameras}

    def _start_decoder(self, camera: CameraConfig) -> _Decoder:
        spec = decoder_spec(
            camera,
            default_backlog=self.config.redis.frames_maxlen,
            until_done=self.until_done,
            decode_threads=decode_threads(self.config),
            # a live camera keeps at most one batch waiting in its stream: beyond that the
            # pipeline is behind, and older frames would only raise the latency
            live_backlog=self.config.batching.max_batch_size,
        )
        stop = ProcessFlag()  # a decoder killed while waiting cannot hang set()
        return _Decoder(spec, stop, self._spawn(spec, stop))

    def _spawn(self, spec: DecoderSpec, stop: ProcessFlag) -> multiprocessing.process.BaseProcess:
        letterbox, keys = self._spawn_args
        self._sessions[spec.camera] += 1  # each ends with one end entry, its own or ours
        process = multiprocessing.get_context("spawn").Process(
            target=run_decoder_process,
            args=(
                spec,
                self.redis_url,
                keys.prefix,
                letterbox,
                stop,
                self._transport,
                # split roles: no batcher here to wait for; a decoder keeps its shm ring until
                # its stream is read (or nobody read it for a while)
                self._released if self.role == "all" else None,
                os.getpid(),  # the decoder dies with this process, however it ends
                self._reconnect_timeout_s,
                letterbox.max_bytes,
                self.config.redis.cluster,
            ),
            name=f"fb-decoder-{spec.camera}",
            daemon=True,
        )
        process.start()
        return process

    def _http_app(self, registry: CollectorRegistry, control: Control, live: LiveFrames):
        return build_app(
            control=control,
            cameras=self,
            registry=registry,
            live=live,
            utilization=self._metrics.utilization.ratio,
            label=lambda class_id: self._label(class_id),
            token=self.config.http.token,
        )

    # --- running ------------------------------------------------------------------------------
    @staticmethod
    def _run_batcher(
        worker: BatchWorker, stop: threading.Event, errors: list[BaseException]
    ) -> None:
        try:
            worker.run(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the supervising thread
            errors.append(exc)

    def _supervise(self, client, keys, batchers, errors, accounting, last_event) -> None:
        """Until stopped, a worker fails, or (``until_done``) every worker finished its
        cameras: a worker done with its own cameras must not stop the others."""
        events = EventLog(client, keys)
        decoders = self._decoders

        def running() -> bool:
            if self.role == "decode":  # until stopped, or every decoder (files) finished
                return not all(d.finished for d in decoders.values())
            return any(b.is_alive() for b in batchers)

        while running() and not errors and not self.stop.wait(SUPERVISE_TICK_S):
            if self._keeper is not None:
                self._keeper.tick()
            self._control.tick()  # API requests, on this thread
            self._control.states.sample(accounting.processed_counts())
            last_event = self._report_events(events, last_event)
            self._check_decoders(client, keys, decoders)
            self._finish_removals(accounting)
            file_cameras = [c for c, d in decoders.items() if not d.spec.live and not d.removing]
            if self.until_done and accounting.ended(file_cameras):
                self._stop_all(decoders)  # files are done: live cameras stop and end too
        self._report_events(events, last_event)
        if self.stop.is_set():
            log.info("stopping: finishing the batch in flight")

    def _report_events(self, events: EventLog, last_event: str) -> str:
        for event_id, event in events.read_after(last_event):
            last_event = event_id
            self._control.states.on_event(event)
            self.on_event(event)
        return last_event

    def _check_decoders(self, client, keys, decoders: dict[str, _Decoder]) -> None:
        now = time.monotonic()
        for decoder in decoders.values():
            if decoder.finished:
                continue
            process = decoder.process
            if process.is_alive():
                if decoder.restarts and now - decoder.started_at >= HEALTHY_AFTER_S:
                    decoder.restarts = 0  # a crash after a healthy spell starts at 1 s again
                continue
            if decoder.restart_at is not None:
                if now >= decoder.restart_at and not self._stopping.is_set():
                    decoder.process = self._spawn(decoder.spec, decoder.stop)
                    decoder.restart_at, decoder.started_at = None, now
                    self._control.states.set(decoder.spec.camera, "starting")
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
            restart = decoder.spec.live or decoder.spec.loop
            if restart and not self.until_done and not decoder.removing:
                decoder.restarts += 1
                delay = min(2.0**decoder.restarts, RESTART_BACKOFF_MAX_S)
                decoder.restart_at = now + delay
                self._control.states.set(camera, "restarting")
            else:
                decoder.finished = True

    def _remove_rings(self, keys: StreamKeys, decoders: dict[str, _Decoder]) -> None:
        """After the decoders stopped: the rings of any that were killed on the way out."""
        pids = [d.process.pid for d in decoders.values()]
        remove_segments(keys.prefix, host=self._host, pids=pids)

    def _stop_all(self, decoders: dict[str, _Decoder]) -> None:
        self._stopping.set()
        for decoder in decoders.values():
            decoder.stop.set()

    def _stop_decoders(self, decoders: dict[str, _Decoder]) -> None:
        """stop event → join(timeout) → terminate → kill: never leaves a decoder behind."""
        self._stop_all(decoders)
        deadline = time.monotonic() + DECODER_JOIN_S
        for decoder in decoders.values():
            decoder.process.join(max(0.0, deadline - time.monotonic()))
        for decoder in decoders.values():
            if decoder.process.is_alive():
                decoder.process.terminate()
                decoder.process.join(2.0)
            if decoder.process.is_alive():
                decoder.process.kill()
                decoder.process.join()

    # --- cameras changed while running (the HTTP API; on the supervisor's thread) -------------
    def add_camera(self, data: dict[str, Any]) -> CameraView:
        """Validate a camera as a config entry, start its decoder and give it to a worker: the
        one that had it before (its reader may still hold the stream), else the one with the
        fewest active cameras."""
        if self.until_done:
            raise CameraConflict("a --until-done run takes its cameras from the config only")
        if self.role != "all":
            raise CameraConflict("framebatch detect takes its cameras from the config only")
        if self._stopping.is_set():
            raise CameraConflict("the pipeline is stopping")
        try:
            camera = CameraConfig.model_validate(data, context={"base_dir": self.config_dir})
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, CameraConfig), "camera") from None
        decoders = self._decoders
        previous = decoders.get(camera.id)
        if previous is not None and self._control.states.state(camera.id) != "removed":
            raise CameraConflict(f"camera id {camera.id!r} is in use")
        active = [d for d in decoders.values() if not d.removing]
        if len(active) >= MAX_CAMERAS_PER_DAEMON:
            raise CameraConflict(f"{len(active)} cameras: the most one daemon runs")
        maxlen = self.config.redis.frames_maxlen
        if camera.max_backlog is not None and camera.max_backlog > maxlen:
            raise ConfigError([f"max_backlog: must be <= redis.frames_maxlen ({maxlen})"], "camera")
        if previous is None:  # what an earlier run left in its stream, as at start
            drain(
                self._client, self._keys, [camera.id], accounting=self._accounting, acks=self._acks
            )
        self._prepare_stream(self._client, self._keys, camera.id)
        self.config = self.config.model_copy(
            update={"cameras": [c for c in self.config.cameras if c.id != camera.id] + [camera]}
        )
        self._control.states.add(camera.id, camera.url, camera.priority, camera.is_live)
        self._metrics.add_camera(camera.id)
        self._accounting.track(camera.id)
        self.removed.discard(camera.id)
        decoder = decoders[camera.id] = self._start_decoder(camera)
        if previous is not None and previous.worker is not None:
            worker = previous.worker
        else:
            worker = min(self._workers, key=lambda w: sum(d.worker is w for d in active))
        decoder.worker = worker
        worker.changes.add(camera.id, self._rules(camera))
        log.info("camera %s added (%s)", camera.id, redact_url(camera.url))
        return self._control.camera(camera.id)

    def set_priority(self, camera_id: str, priority: int) -> CameraView:
        decoder = self._active(camera_id)
        camera = self.config.camera(camera_id).model_copy(update={"priority": priority})
        self.config = self.config.model_copy(
            update={"cameras": [camera if c.id == camera_id else c for c in self.config.cameras]}
        )
        self._control.states.set_priority(camera_id, priority)
        assert decoder.worker is not None
        decoder.worker.changes.set_rules(camera_id, self._rules(camera))
        return self._control.camera(camera_id)

    def remove_camera(self, camera_id: str) -> CameraView:
        """Stop the camera's decoder; it is removed once every decoder session it had has
        ended and every frame it sent is processed or counted (``_finish_removals``)."""
        decoder = self._active(camera_id)
        decoder.removing = True
        if decoder.restart_at is not None:  # dead, its end entry written: not restarted
            decoder.restart_at, decoder.finished = None, True
        decoder.stop.set()
        decoder.kill_at = time.monotonic() + DECODER_JOIN_S  # one that hangs is killed then
        self._control.states.set(camera_id, "draining")
        log.info("camera %s: removing (draining its frames)", camera_id)
        return self._control.camera(camera_id)

    def _active(self, camera_id: str) -> _Decoder:
        decoder = self._decoders.get(camera_id)
        if decoder is None:
            raise CameraNotFound(camera_id)
        if decoder.removing:
            state = self._control.states.state(camera_id)
            raise CameraConflict(f"camera {camera_id!r} is {state}: it is being removed or was")
        return decoder

    def _rules(self, camera: CameraConfig) -> CameraRules:
        return camera_rules(self.config, camera, until_done=self.until_done)

    def _finish_removals(self, accounting: Accounting) -> None:
        now = time.monotonic()
        for camera, decoder in self._decoders.items():
            if not decoder.removing or self._control.states.state(camera) == "removed":
                continue
            if decoder.process.is_alive():
                if decoder.kill_at is not None and now >= decoder.kill_at:
                    log.warning("camera %s: decoder did not stop, killed", camera)
                    decoder.process.kill()  # the supervisor writes its end entry
                    decoder.kill_at = None
                continue
            # every session's end read (not an earlier one's: a restart or a re-added id), and
            # each frame read before it published or dropped
            if accounting.end_count(camera) < self._sessions[camera]:
                continue
            if accounting.outstanding(camera):
                continue
            decoder.finished = True
            assert decoder.worker is not None
            decoder.worker.changes.forget(camera)
            self._live.forget(camera)
            self._control.states.set(camera, "removed")
            self.removed.add(camera)
            log.info("camera %s removed", camera)

    def _bind_http(self, listen: str) -> socket.socket | None:
        """The HTTP socket. A port set in the config or with --http that is taken is bad input
        (exit 2); the default one taken (another daemon on this host) only costs this run its
        endpoint, with a warning, as running several daemons is how one goes past 64 cameras."""
        try:
            return bind(listen)
        except ValueError:
            if "listen" in self.config.http.model_fields_set:
                raise
            log.warning(
                "http: %s is taken (another framebatch?): no metrics, API or live view for this "
                "run; set http.listen (or --http) to serve them elsewhere",
                listen,
            )
            return None
