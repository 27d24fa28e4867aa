"""The composition root: one framebatch process, composed for its role by a named factory.

* :meth:`Pipeline.init_run` (``framebatch run``): the decoders, the detector pool over every
  camera, the camera API;
* :meth:`Pipeline.init_decode` (``framebatch decode``): the decoders only;
* :meth:`Pipeline.init_detect` (``framebatch detect``): one detector worker whose cameras come
  through leases.

A factory opens what its role needs (Redis and the run's bookkeeping, the HTTP endpoint, the
decoders, which start at once so their start-up overlaps the model load, the models) and
returns a pipeline that ``run()`` supervises: every :class:`~pipeline.supervisor.part.Part` is
ticked every ``SUPERVISE_TICK_S`` on this thread until the run's ``stop`` is set (a signal, or
a caller), the part the role ends with is done (``--until-done``: every camera ended;
``decode``: every decoder finished), or a detector worker failed.

The stop order, the one path every way of ending takes:

1. the run's ``stop`` is set: every detector worker stops reading, dispatches what its policy
   holds and publishes its batches in flight; the API takes no more requests;
2. the parts stop in the order the role composed them: decoder status events are relayed a
   last time; the decoders restart no more and each is asked to stop; the detector pool waits
   for its workers, renewing its leases meanwhile, then leaves them to the other workers;
3. what was opened closes in reverse (the run's exit stack): the models; the HTTP server; the
   decoders' shm rings are released, the decoders joined (join → terminate → kill) and the
   rings of any killed removed; the sinks; the Redis clients; the private redis-server.

A second signal exits at once (``pipeline.supervisor.decoders.abandon_rings``).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from detectors.base import BackendUnavailable
from detectors.detector import Detector
from pipeline.config import Config
from pipeline.errors import BadInput, FramebatchError, RedisUnavailable, RunFailed, StageFailed
from pipeline.leases.camera_leases import lease_probes
from pipeline.ledger.earlier_runs import drain
from pipeline.ledger.summary import RunSummary
from pipeline.serve.control import CameraView
from pipeline.stages.lifecycle import is_redis_outage
from pipeline.supervisor.builders import check_run_mode, load_detector
from pipeline.supervisor.cameras import FixedCameras, LiveCameras
from pipeline.supervisor.decoders import DecoderSupervisor
from pipeline.supervisor.detectors import DetectorPool, PoolResources
from pipeline.supervisor.part import Part
from pipeline.supervisor.services import Services, open_services
from pipeline.supervisor.status_events import EventRelay
from pipeline.telemetry import NO_TELEMETRY, Telemetry
from streams.embedded_redis import RedisServerError
from streams.redis_access import RedisAccessError
from streams.redis_cluster import server_time_ms
from streams.redis_connect import is_outage
from streams.sinks import DetectionSink, SinkContext, open_sinks
from streams.sinks.base import SinkError
from streams.urls import redact_url

log = logging.getLogger(__name__)

SUPERVISE_TICK_S = 0.2
#: What the lower layers raise for bad input found before the run starts (exit 2).
START_ERRORS = (
    FileNotFoundError,
    ValueError,
    RedisServerError,
    RedisAccessError,
    BackendUnavailable,
    SinkError,
)


@dataclass(frozen=True)
class RunOptions:
    """How a factory's caller wants the run: the same for every role."""

    stop: threading.Event  # the run's one stop signal (set it from a signal handler)
    on_event: Callable[[dict[str, str]], None]  # each decoder status event, as it comes
    telemetry: Telemetry  # hears of every frame, batch and failure (the bench's timing)
    serve_http: bool  # the HTTP endpoint of http.listen (benchmarks leave it off)


class Pipeline:
    """One framebatch process; made by ``init_run``, ``init_decode`` or ``init_detect``.
    ``run()`` blocks until the run ends, then closes everything the factory opened."""

    def __init__(
        self,
        config: Config,
        *,
        options: RunOptions,
        services: Services,
        stack: ExitStack,
        parts: list[Part],
        ends_with: Part,
        http_url: str | None = None,
    ):
        self.config = config
        self.stop = options.stop
        self.http_url = http_url  # where the HTTP endpoint serves, if it does
        self._options = options
        self._services = services
        self._stack = stack
        self._parts = parts
        self._ends_with = ends_with

    # --- the factories ------------------------------------------------------------------------
    @classmethod
    def init_run(
        cls,
        config: Config,
        *,
        until_done: bool = False,
        config_dir: Path | None = None,
        detector_factory: Callable[[Config, str], Detector] = load_detector,
        stop: threading.Event | None = None,
        on_event: Callable[[dict[str, str]], None] = lambda event: None,
        telemetry: Telemetry = NO_TELEMETRY,
        serve_http: bool = True,
    ) -> Pipeline:
        """``framebatch run``: decoders and detector workers for every camera, cameras changed
        live through the API (not with ``until_done``: a replay exits once every file camera
        is processed).  ``config_dir``: where the API resolves relative paths of cameras it
        adds (default: the current folder); ``detector_factory``: how each worker's detector
        is built (the bench passes one that times each stage)."""
        check_run_mode(config, until_done=until_done)
        options = _options(stop, on_event, telemetry, serve_http)
        with _composing(config) as stack:
            listen = _bind_http(config, stack) if serve_http else None
            services = open_services(
                config, stack, telemetry=telemetry, live_view=listen is not None
            )
            events = EventRelay(services.client, services.keys, services.states, on_event)
            sink = _open_sink(config, services, stack)
            # what an earlier run left, before any decoder of this run can trim it away
            camera_ids = [camera.id for camera in config.cameras]
            drain(
                services.client,
                services.keys,
                camera_ids,
                accounting=services.accounting,
                acks=services.acks,
            )
            since_ms = server_time_ms(services.client)  # stream entries older than this run
            decoders = DecoderSupervisor(
                config=config,
                redis_url=services.redis_url,
                client=services.client,
                keys=services.keys,
                accounting=services.accounting,
                states=services.states,
                until_done=until_done,
            )
            decoders.launch()  # first: their start-up overlaps the model load
            stack.callback(decoders.close)
            pool = DetectorPool.sharded(
                config,
                _pool_resources(services, sink),
                stop=options.stop,
                until_done=until_done,
                detector_factory=detector_factory,
            )
            live_cameras = LiveCameras(
                config,
                config_dir=config_dir or Path.cwd(),
                until_done=until_done,
                decoders=decoders,
                pool=pool,
                control=services.control,
                metrics=services.metrics,
                live=services.live,
                redis_client=services.client,
                keys=services.keys,
                acks=services.acks,
            )
            http_url = _serve_http(listen, services, live_cameras, pool, config, stack)
            _load(pool, services, config, stack, since_ms=since_ms)
            return cls(
                config,
                options=options,
                services=services,
                stack=stack,
                parts=[events, decoders, live_cameras, pool],
                ends_with=pool,
                http_url=http_url,
            )

    @classmethod
    def init_decode(
        cls,
        config: Config,
        *,
        stop: threading.Event | None = None,
        on_event: Callable[[dict[str, str]], None] = lambda event: None,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> Pipeline:
        """``framebatch decode``: the config's decoders only, into the shared Redis; detector
        workers elsewhere read their frames.  Ends when stopped, or once every decoder
        finished (file cameras)."""
        _check_shared_redis(config, "decode")
        options = _options(stop, on_event, telemetry, serve_http=False)
        with _composing(config) as stack:
            services = open_services(config, stack, telemetry=telemetry, live_view=False)
            events = EventRelay(services.client, services.keys, services.states, on_event)
            decoders = DecoderSupervisor(
                config=config,
                redis_url=services.redis_url,
                client=services.client,
                keys=services.keys,
                accounting=services.accounting,
                states=services.states,
                # no detector worker here: a decoder keeps its ring until its stream is read
                rings_read_here=False,
            )
            decoders.launch()
            stack.callback(decoders.close)
            return cls(
                config,
                options=options,
                services=services,
                stack=stack,
                parts=[events, decoders],
                ends_with=decoders,
            )

    @classmethod
    def init_detect(
        cls,
        config: Config,
        *,
        device: str | None = None,
        worker_id: str | None = None,
        detector_factory: Callable[[Config, str], Detector] = load_detector,
        stop: threading.Event | None = None,
        on_event: Callable[[dict[str, str]], None] = lambda event: None,
        telemetry: Telemetry = NO_TELEMETRY,
        serve_http: bool = True,
    ) -> Pipeline:
        """``framebatch detect``: one detector worker on ``device`` (default: the config's
        first) that takes its cameras through leases, shared with the other workers of the
        config's cameras; ``worker_id`` unique among them (default: host-pid-random)."""
        _check_shared_redis(config, "detect")
        options = _options(stop, on_event, telemetry, serve_http)
        with _composing(config) as stack:
            listen = _bind_http(config, stack) if serve_http else None
            services = open_services(
                config,
                stack,
                telemetry=telemetry,
                live_view=listen is not None,
                probes=lease_probes,
            )
            events = EventRelay(services.client, services.keys, services.states, on_event)
            sink = _open_sink(config, services, stack)
            pool = DetectorPool.leased(
                config,
                _pool_resources(services, sink),
                device=device,
                worker_id=worker_id,
                stop=options.stop,
                until_done=False,
                detector_factory=detector_factory,
            )
            fixed = FixedCameras("framebatch detect takes its cameras from the config only")
            http_url = _serve_http(listen, services, fixed, pool, config, stack)
            # workers come and go: every entry is for whoever reads it
            _load(pool, services, config, stack, since_ms=0)
            return cls(
                config,
                options=options,
                services=services,
                stack=stack,
                parts=[events, pool],
                ends_with=pool,
                http_url=http_url,
            )

    # --- running ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Supervise until the run ends, then stop in the stop order and close; raises
        ``RunFailed`` (exit 3) with a one-line message when the run failed."""
        with _run_errors(self.config), self._stack:
            for part in self._parts:
                part.start()
            self._services.control.ready.set()
            try:
                while not self._ends_with.done() and not self.stop.wait(SUPERVISE_TICK_S):
                    self._tick()
                if self.stop.is_set():
                    log.info("stopping: finishing the batch in flight")
            finally:
                self.stop.set()
                self._services.control.stopped()
                for part in self._parts:
                    part.stop()
            for part in self._parts:
                part.raise_failure()
            return self._services.accounting.summary()

    def close(self) -> None:
        """Close what the factory opened without running (``run`` closes it itself)."""
        self._stack.close()

    def _tick(self) -> None:
        control = self._services.control
        control.tick()  # API requests, on this thread
        control.states.sample(self._services.accounting.processed_counts())
        for part in self._parts:
            part.tick()

    # --- what callers ask while it runs, and after -------------------------------------------
    def cameras(self) -> list[CameraView]:
        """Each camera's state and counts now (thread-safe)."""
        return self._services.control.cameras()

    def cameras_in(self, state: str) -> list[str]:
        """Cameras in a state: ``failed`` (their source failed and was not restarted: what
        ``framebatch decode`` knows of its cameras' end), ``removed`` (through the API:
        whatever ended them, they do not decide the run's exit status)."""
        states = self._services.states.states()
        return sorted(camera for camera, current in states.items() if current == state)


# --- composing ----------------------------------------------------------------------------------
def _options(
    stop: threading.Event | None,
    on_event: Callable[[dict[str, str]], None],
    telemetry: Telemetry,
    serve_http: bool,
) -> RunOptions:
    return RunOptions(stop or threading.Event(), on_event, telemetry, serve_http)


def _check_shared_redis(config: Config, role: str) -> None:
    if not config.redis.url:
        raise BadInput(
            f"framebatch {role} needs redis.url: the Redis its decoders and detector workers "
            "share (without it each process would start a private one)"
        )


@contextmanager
def _composing(config: Config) -> Iterator[ExitStack]:
    """The exit stack a factory opens into, closed if composing fails; what fails then is
    bad input (exit 2), or Redis gone, or a bug (a traceback)."""
    stack = ExitStack()
    try:
        with _errors(config, started=False):
            yield stack
    except BaseException:
        stack.close()
        raise


@contextmanager
def _run_errors(config: Config) -> Iterator[None]:
    with _errors(config, started=True):
        yield


@contextmanager
def _errors(config: Config, *, started: bool) -> Iterator[None]:
    """Whatever ends the run, as a ``FramebatchError``: bad input before the batchers start
    (exit 2), a failed run after (exit 3); anything else is a bug (a traceback)."""
    try:
        yield
    except FramebatchError as exc:
        cause = exc.__cause__
        if isinstance(exc, StageFailed) and cause is not None and is_redis_outage(cause):
            raise _redis_gone(config, cause) from cause
        raise
    except START_ERRORS as exc:
        if started:
            raise
        raise BadInput(redact_url(str(exc))) from exc
    except redis.RedisError as exc:
        if is_outage(exc):
            raise _redis_gone(config, exc) from exc
        raise RunFailed(f"the run failed: {redact_url(str(exc))}") from exc


def _redis_gone(config: Config, exc: BaseException) -> RedisUnavailable:
    where = redact_url(config.redis.url or "the private redis-server")
    timeout = config.redis.reconnect_timeout_s
    return RedisUnavailable(
        f"Redis at {where} unreachable for more than {timeout:.0f} s "
        f"(redis.reconnect_timeout_s): {redact_url(str(exc))}"
    )


def _bind_http(config: Config, stack: ExitStack) -> socket.socket | None:
    """The HTTP socket, bound before anything slow starts.  A port set in the config or with
    --http that is taken is bad input (exit 2); the default one taken (another daemon on this
    host) only costs this run its endpoint, with a warning, as running several daemons is how
    one goes past 64 cameras."""
    listen = config.http.listen
    if listen is None:
        return None
    from pipeline.serve.http import bind  # the HTTP stack only where it serves

    try:
        sock = bind(listen)
    except ValueError:
        if "listen" in config.http.model_fields_set:
            raise
        log.warning(
            "http: %s is taken (another framebatch?): no metrics, API or live view for this "
            "run; set http.listen (or --http) to serve them elsewhere",
            listen,
        )
        return None
    stack.callback(sock.close)
    return sock


def _serve_http(
    sock: socket.socket | None,
    services: Services,
    cameras: LiveCameras | FixedCameras,
    pool: DetectorPool,
    config: Config,
    stack: ExitStack,
) -> str | None:
    """The HTTP endpoint on its own thread (metrics, health, the camera API, the live view),
    answering while the models load."""
    if sock is None:
        return None
    from pipeline.serve.http import HttpServer, build_app

    app = build_app(
        control=services.control,
        cameras=cameras,
        registry=services.registry,
        live=services.live,
        utilization=services.metrics.utilization.ratio,
        label=pool.label,
        token=config.http.token,
    )
    server = HttpServer(app, sock)
    server.start()
    stack.callback(server.close)
    return server.url


def _open_sink(config: Config, services: Services, stack: ExitStack) -> DetectionSink:
    sink = open_sinks(
        config.sinks,
        SinkContext(
            services.client, services.keys, detections_maxlen=config.redis.detections_maxlen
        ),
    )
    stack.callback(sink.close)  # after the workers stopped writing
    return sink


def _pool_resources(services: Services, sink: DetectionSink) -> PoolResources:
    return PoolResources(
        redis_client=services.client,
        keys=services.keys,
        accounting=services.accounting,
        telemetry=services.telemetry,
        sink=sink,
    )


def _load(
    pool: DetectorPool, services: Services, config: Config, stack: ExitStack, *, since_ms: int
) -> None:
    """The pool's models, loaded and warm; the metrics told its shape."""
    stack.callback(pool.close)
    pool.load(since_ms=since_ms)
    services.metrics.configure(
        max_batch_size=config.batching.max_batch_size, instances=pool.instances
    )
