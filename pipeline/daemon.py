"""The composition root: one framebatch process, composed for its role by a named factory.

* :meth:`Pipeline.init_run` (``framebatch run``): the decoders, the detector pool over every
  camera, the camera API;
* :meth:`Pipeline.init_decode` (``framebatch decode``): one decode worker, whose cameras come
  through leases;
* :meth:`Pipeline.init_detect` (``framebatch detect``): one detector worker whose cameras come
  through leases.

A factory opens what its role needs (Redis and the run's bookkeeping, the HTTP endpoint, the
decoders, which start at once so their start-up overlaps the model load, the models) and
returns a pipeline that ``run()`` supervises: every :class:`~pipeline.supervisor.part.Part` is
ticked every ``SUPERVISE_TICK_S`` on this thread until the run's ``stop`` is set (a signal, or
a caller), the part the role ends with is done (``--until-done``: every camera ended;
``decode``: every decoder finished), or a detector worker failed.

The stop order, the one path every way of ending takes:

1. the run's ``stop`` is set (if a signal has not set it already); the API takes no more
   requests;
2. the parts stop in the order the role composed them, each whatever the one before raised:
   the decoders restart no more and each is asked to stop (it writes its session's end entry
   after the frame it is on); the detector pool's workers read on until each camera's end
   entry, for at most ``DRAIN_S`` (6 s; a leased worker, whose decoders run elsewhere, stops
   reading at once), dispatch what their policies hold and publish their batches in flight,
   leases renewed meanwhile, then leave the leases to the other workers; decoder status
   events are relayed a last time (how each camera ended);
3. what was opened closes in reverse (the run's exit stack): the models; the HTTP server; the
   decoders' shm rings are released, the decoders joined (join → terminate → kill) and the
   rings of any killed removed; the sinks; the Redis clients; the private redis-server.

The command line sets ``stop`` on the first SIGINT/SIGTERM; a second exits at once, after
removing the shm rings of decoders that died (``pipeline.supervisor.decoders.abandon_rings``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from detectors.detector import Detector
from pipeline.analytics.snapshots import SnapshotStore
from pipeline.analytics.stage import AnalyticsSettings
from pipeline.config import Config
from pipeline.errors import BadInput
from pipeline.fleet.api import RegisteredCameraOps
from pipeline.fleet.following import RegisteredLeases
from pipeline.fleet.registry import CameraRegistry, registry_probes
from pipeline.fleet.sharded import ShardedDecoders, decode_lease, decode_probes
from pipeline.leases.camera_leases import lease_probes, new_worker_id
from pipeline.ledger.earlier_runs import drain
from pipeline.ledger.summary import RunSummary
from pipeline.serve.control import CameraView
from pipeline.serve.metrics import DecodePlacementCollector, OutputsCollector
from pipeline.supervisor.boundary import composing, run_errors
from pipeline.supervisor.builders import check_run_mode, load_detector
from pipeline.supervisor.cameras import LiveCameras
from pipeline.supervisor.decoders import DecoderSupervisor
from pipeline.supervisor.detectors import DetectorPool, PoolResources
from pipeline.supervisor.endpoint import bind_http, start_http
from pipeline.supervisor.outputs import OutputsPart
from pipeline.supervisor.part import SLOW_TICK_S, Part
from pipeline.supervisor.services import Services, open_services
from pipeline.supervisor.status_events import EventRelay
from pipeline.telemetry import NO_TELEMETRY, Telemetry
from streams.redis_cluster import server_time_ms
from streams.sinks import DetectionSink, SinkContext, open_sinks

log = logging.getLogger(__name__)

SUPERVISE_TICK_S = 0.2
OnEvent = Callable[[dict[str, str]], None]  # a decoder status event, as it comes


class Pipeline:
    """One framebatch process; made by ``init_run``, ``init_decode`` or ``init_detect``.
    ``run()`` blocks until the run ends, then closes everything the factory opened (use the
    pipeline as a context manager to close it if ``run`` is never reached)."""

    def __init__(
        self,
        config: Config,
        *,
        stop: threading.Event,
        services: Services,
        stack: ExitStack,
        parts: list[Part],
        ends_with: Part,
        http_url: str | None = None,
    ):
        self.config = config
        self.stop = stop  # the run's one stop signal: set it (from a signal handler) to end it
        self.http_url = http_url  # where the HTTP endpoint serves, if it does
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
        on_event: OnEvent = lambda event: None,
        telemetry: Telemetry = NO_TELEMETRY,
        serve_http: bool = True,
    ) -> Pipeline:
        """``framebatch run``: decoders and detector workers for every camera, cameras changed
        live through the API (not with ``until_done``: a replay exits once every file camera
        is processed).  ``config_dir``: where the API resolves relative paths of cameras it
        adds (default: the current folder); ``detector_factory``: how each worker's detector
        is built (the bench passes one that times each stage)."""
        check_run_mode(config, until_done=until_done)
        stop = stop or threading.Event()
        with composing(config) as stack:
            http_socket = bind_http(config, stack) if serve_http else None
            services = open_services(
                config,
                stack,
                telemetry=telemetry,
                live_view=http_socket is not None,
                probes=None if until_done else registry_probes,
            )
            events = EventRelay(services, on_event)
            sink = _open_sink(config, services, stack)
            snapshots = _snapshot_store(config)
            outputs = _open_outputs(config, services, stack)  # a refused password: exit 2 now
            # what an earlier run left, before any decoder of this run can trim it away
            cameras = [camera.id for camera in config.cameras]
            drain(
                services.client,
                services.keys,
                cameras,
                accounting=services.accounting,
                acks=services.acks,
            )
            since_ms = server_time_ms(services.client)  # stream entries older than this run
            registry = None
            if not until_done:  # a replay's cameras are the config's, and no one else's
                registry = CameraRegistry(services.client, services.keys)
                registry.seed(config.cameras)
            decoders = DecoderSupervisor(config, services, until_done=until_done)
            decoders.launch()  # first: their start-up overlaps the model load
            stack.callback(decoders.close)
            pool = DetectorPool.sharded(
                config,
                _pool_resources(services, sink, config, snapshots),
                stop=stop,
                until_done=until_done,
                detector_factory=detector_factory,
            )
            live_cameras = LiveCameras(
                config,
                services,
                config_dir=config_dir or Path.cwd(),
                until_done=until_done,
                decoders=decoders,
                pool=pool,
                registry=registry,
            )
            http_url = start_http(
                http_socket,
                services,
                cameras=live_cameras,
                label=pool.label,
                token=config.http.token,
                stack=stack,
                snapshots=snapshots,
            )
            _load(pool, services, config, stack, since_ms=since_ms)
            return cls(
                config,
                stop=stop,
                services=services,
                stack=stack,
                parts=[decoders, live_cameras, pool, events, outputs],
                ends_with=pool,
                http_url=http_url,
            )

    @classmethod
    def init_decode(
        cls,
        config: Config,
        *,
        worker_id: str | None = None,
        capacity: float | None = None,
        stop: threading.Event | None = None,
        on_event: OnEvent = lambda event: None,
        telemetry: Telemetry = NO_TELEMETRY,
        serve_http: bool = True,
    ) -> Pipeline:
        """``framebatch decode``: one decode worker, which decodes its share of the registered
        cameras (taken through leases, shared with the other decode workers; ``worker_id``
        unique among them, default host-pid-random; ``capacity``: the most camera weight it
        takes, default ``decoding.worker_capacity``) into the shared Redis; detector workers
        elsewhere read their frames (it opens no sink: it writes no detection; its HTTP
        endpoint serves metrics, health and its placement, ``/api/decoders``).  Ends when
        stopped, or once every registered camera is a file decoded (by any worker)."""
        _check_shared_redis(config, "decode")
        stop = stop or threading.Event()
        with composing(config) as stack:
            http_socket = bind_http(config, stack) if serve_http else None
            services = open_services(
                config, stack, telemetry=telemetry, live_view=False, probes=decode_probes
            )
            events = EventRelay(services, on_event)
            # relayed once more after the decoders are joined: how each of them ended
            stack.callback(events.stop)
            registry = CameraRegistry(services.client, services.keys)
            registry.seed(config.cameras)
            lease = decode_lease(config, worker_id or new_worker_id())
            # no detector worker here: a decoder keeps its ring until its stream is read
            decoders = DecoderSupervisor(config, services, rings_read_here=False, lease=lease)
            sharded = ShardedDecoders.joining(
                config,
                decoders,
                services,
                lease=lease,
                capacity=config.decoding.worker_capacity if capacity is None else capacity,
                stop=stop,
            )
            stack.callback(sharded.leave)  # once the decoders are joined (the next callback)
            stack.callback(decoders.close)
            services.registry.register(DecodePlacementCollector(sharded.status))
            http_url = start_http(
                http_socket,
                services,
                cameras=None,
                token=config.http.token,
                stack=stack,
                decoders=sharded.status,
            )
            return cls(
                config,
                stop=stop,
                services=services,
                stack=stack,
                parts=[decoders, sharded, events],
                ends_with=sharded,
                http_url=http_url,
            )

    @classmethod
    def init_detect(
        cls,
        config: Config,
        *,
        device: str | None = None,
        worker_id: str | None = None,
        config_dir: Path | None = None,
        detector_factory: Callable[[Config, str], Detector] = load_detector,
        stop: threading.Event | None = None,
        on_event: OnEvent = lambda event: None,
        telemetry: Telemetry = NO_TELEMETRY,
        serve_http: bool = True,
    ) -> Pipeline:
        """``framebatch detect``: one detector worker on ``device`` (default: the config's
        first) that takes its cameras through leases, shared with the other workers of the
        config's cameras; ``worker_id`` unique among them (default: host-pid-random); the
        cameras are the registry's, changed through the API of any worker (``config_dir``: where
        relative paths of cameras added are resolved)."""
        _check_shared_redis(config, "detect")
        stop = stop or threading.Event()
        with composing(config) as stack:
            http_socket = bind_http(config, stack) if serve_http else None
            services = open_services(
                config,
                stack,
                telemetry=telemetry,
                live_view=http_socket is not None,
                probes=lambda client, key: lease_probes(client, key) + registry_probes(client, key),
            )
            events = EventRelay(services, on_event)
            sink = _open_sink(config, services, stack)
            snapshots = _snapshot_store(config)
            outputs = _open_outputs(config, services, stack)  # a refused password: exit 2 now
            registry = CameraRegistry(services.client, services.keys)
            registry.seed(config.cameras)
            pool = DetectorPool.leased(
                config,
                _pool_resources(services, sink, config, snapshots),
                device=device,
                worker_id=worker_id,
                stop=stop,
                detector_factory=detector_factory,
            )
            http_url = start_http(
                http_socket,
                services,
                cameras=RegisteredCameraOps(registry, services, pool, config_dir or Path.cwd()),
                label=pool.label,
                token=config.http.token,
                stack=stack,
                snapshots=snapshots,
            )
            # workers come and go: every entry is for whoever reads it
            _load(pool, services, config, stack, since_ms=0)
            return cls(
                config,
                stop=stop,
                services=services,
                stack=stack,
                parts=[pool, RegisteredLeases(registry, pool, services), events, outputs],
                ends_with=pool,
                http_url=http_url,
            )

    # --- running ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Supervise until the run ends, then stop in the stop order and close; raises
        ``RunFailed`` (exit 3) with a one-line message when the run failed."""
        with run_errors(self.config, started=True), self._stack:
            for part in self._parts:
                part.start()
            self._services.control.ready.set()
            try:
                while not self._ends_with.done() and not self.stop.wait(SUPERVISE_TICK_S):
                    self._tick()
                if self.stop.is_set():
                    log.info("stopping: reading each camera to its end, then the batches in flight")
            finally:
                self._stop_in_order()
            for part in self._parts:
                part.raise_failure()
            return self._services.accounting.summary()

    def _tick(self) -> None:
        started = time.monotonic()
        control = self._services.control
        control.tick()  # API requests, on this thread
        control.states.sample(self._services.accounting.processed_counts())
        spent = []
        for part in self._parts:
            before = time.monotonic()
            part.tick()
            spent.append((type(part).__name__, time.monotonic() - before))
        took = time.monotonic() - started
        if took > SLOW_TICK_S:
            # leases are renewed from this tick: one this slow lets them run out
            log.warning(
                "supervisor tick took %.1f s (%s)",
                took,
                ", ".join(f"{name} {s:.2f} s" for name, s in spent),
            )

    def _stop_in_order(self) -> None:
        """Steps 1 and 2 of the stop order (the module's docstring); each part stops even if
        one before it raised, the first error going on."""
        self.stop.set()
        self._services.control.stopped()
        with ExitStack() as stopping:
            for part in reversed(self._parts):  # an exit stack runs them last in, first out
                stopping.callback(part.stop)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()  # nothing left to close once run() has

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
def _check_shared_redis(config: Config, role: str) -> None:
    if not config.redis.url:
        raise BadInput(
            f"framebatch {role} needs redis.url: the Redis its decoders and detector workers "
            "share (without it each process would start a private one)"
        )


def _open_sink(config: Config, services: Services, stack: ExitStack) -> DetectionSink:
    context = SinkContext(
        services.client, services.keys, detections_maxlen=config.redis.detections_maxlen
    )
    sink = open_sinks(config.sinks, context)
    stack.callback(sink.close)  # after the workers stopped writing
    return sink


def _open_outputs(config: Config, services: Services, stack: ExitStack) -> OutputsPart:
    """The relay of analytics events to the config's outputs (none: it reads nothing); it
    follows the cameras the run knows, those added through the API too."""
    outputs = OutputsPart(
        config.outputs,
        client=services.client,
        keys=services.keys,
        cameras=lambda: list(services.states.states()),
        redis_kept=bool(config.redis.url),
        fail_fast=services.fail_fast,
    )
    stack.callback(outputs.stop)
    if config.outputs:
        services.registry.register(OutputsCollector(outputs.stats))
    return outputs


def _snapshot_store(config: Config) -> SnapshotStore:
    """Where events' snapshots go (nothing is written until a camera takes one)."""
    settings = config.snapshots
    return SnapshotStore(
        settings.path,
        max_bytes=int(settings.max_size_mb * 2**20),
        max_age_s=settings.max_age_days * 86_400,
    )


def _pool_resources(
    services: Services, sink: DetectionSink, config: Config, snapshots: SnapshotStore
) -> PoolResources:
    return PoolResources(
        redis_client=services.client,
        keys=services.keys,
        accounting=services.accounting,
        telemetry=services.telemetry,
        sink=sink,
        analytics=AnalyticsSettings(
            ((camera.id, camera.analytics) for camera in config.cameras),
            snapshots=snapshots,
        ),
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
