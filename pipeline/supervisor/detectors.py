"""The detector pool: this process's batch workers, each on a thread of its own.

* ``framebatch run``: one worker per device (``model.devices``), the cameras dealt among them
  round-robin (:meth:`DetectorPool.sharded`); cameras added live go to a worker through
  :meth:`DetectorPool.assign`;
* ``framebatch detect``: one worker whose cameras come and go with its leases
  (:meth:`DetectorPool.leased`): a :class:`~pipeline.leases.keeper.LeaseKeeper` turns each
  lease tick into the worker's camera changes.

Lifecycle: constructed (nothing loaded, so the HTTP endpoint answers while models load) →
``load`` (a model per worker, warmed up, the policy seeded with its batch times) → ``start``
(the threads) → ``tick`` on the supervisor's thread → ``stop`` (the workers finish what they
read, leases kept meanwhile, then left) → ``close`` (the models).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from detectors.detector import Detector
from pipeline.analytics.stage import AnalyticsSettings, import_meanwhile
from pipeline.batching import CameraRules
from pipeline.config import CameraConfig, Config
from pipeline.config.analytics import AnalyticsConfig
from pipeline.leases.camera_leases import (
    DETECTORS,
    CameraLeases,
    new_worker_id,
    wait_for_worker_id,
)
from pipeline.leases.keeper import LeaseKeeper
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.stages.changes import CameraChanges
from pipeline.stages.context import WorkerContext
from pipeline.stages.worker import BatchWorker
from pipeline.supervisor.builders import (
    batching_policy,
    camera_rules,
    run_shape,
    seeded_sizes,
    shard_cameras,
)
from pipeline.supervisor.part import Part
from pipeline.telemetry import Telemetry
from streams.groups import all_read
from streams.keys import StreamKeys
from streams.sinks import DetectionSink
from streams.transport import FrameDecoder, host_id

log = logging.getLogger(__name__)

JOIN_TICK_S = 0.2  # how often leases are renewed while the workers finish
#: how long a stopping run's workers read on for their cameras' end entries: a decoder told to
#: stop writes its end after the frame it is on (a stalled RTSP read returns within 5 s)
DRAIN_S = 6.0


@dataclass(frozen=True)
class WorkerPlan:
    """One batch worker to load: its device, its cameras at start, its consumer name."""

    device: str
    cameras: list[str]
    consumer: str


@dataclass(frozen=True)
class PoolResources:
    """What the pool's workers share, opened by the composition root."""

    redis_client: redis.Redis
    keys: StreamKeys
    accounting: Accounting
    telemetry: Telemetry
    sink: DetectionSink
    analytics: AnalyticsSettings  # each camera's, shared with the camera API


class DetectorPool(Part):
    def __init__(
        self,
        config: Config,
        resources: PoolResources,
        *,
        plans: list[WorkerPlan],
        stop: threading.Event,
        until_done: bool,
        detector_factory: Callable[[Config, str], Detector],
        leased: bool = False,
    ):
        """``stop``: the run's stop signal (the pool's ``stop`` is its step of the stop order).
        ``leased``: the one worker takes its cameras through leases, under its plan's
        consumer name."""
        self._config = config
        self._resources = resources
        self._plans = plans
        self._stop = stop
        self._finish = threading.Event()  # workers read on until each camera's end entry
        self._halt = threading.Event()  # workers stop reading now
        self._until_done = until_done
        self._detector_factory = detector_factory
        self._leased = leased
        self._detectors: list[Detector] = []
        self._workers: list[BatchWorker] = []
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []
        self._keeper: LeaseKeeper | None = None
        self._lease_rules: dict[str, CameraRules] = {}  # leased: each camera's, as registered
        self._owner: dict[str, BatchWorker] = {}  # camera -> its worker (removed ones too)
        self._active: set[str] = set()  # cameras assigned and not forgotten
        self._label: Callable[[int], str] = str  # class names once a model is loaded

    @classmethod
    def sharded(
        cls,
        config: Config,
        resources: PoolResources,
        *,
        stop: threading.Event,
        until_done: bool,
        detector_factory: Callable[[Config, str], Detector],
    ) -> DetectorPool:
        """A worker per configured device, the config's cameras dealt round-robin (a device
        left without a camera gets no worker)."""
        devices = config.model.worker_devices
        cameras = [camera.id for camera in config.cameras]
        plans = [
            WorkerPlan(device, share, f"batcher-{index}")
            for index, (device, share) in enumerate(
                zip(devices, shard_cameras(cameras, len(devices)), strict=True)
            )
            if share
        ]
        return cls(
            config,
            resources,
            plans=plans,
            stop=stop,
            until_done=until_done,
            detector_factory=detector_factory,
        )

    @classmethod
    def leased(
        cls,
        config: Config,
        resources: PoolResources,
        *,
        device: str | None,
        worker_id: str | None,
        stop: threading.Event,
        detector_factory: Callable[[Config, str], Detector],
    ) -> DetectorPool:
        """One worker on ``device`` (default: the config's first), no camera until its leases
        deal them; ``worker_id`` unique among the workers (default: host-pid-random)."""
        plan = WorkerPlan(
            device or config.model.worker_devices[0], [], worker_id or new_worker_id()
        )
        return cls(
            config,
            resources,
            plans=[plan],
            stop=stop,
            until_done=False,
            detector_factory=detector_factory,
            leased=True,
        )

    # --- lifecycle ----------------------------------------------------------------------------
    def load(self, *, since_ms: int) -> None:
        """Load each worker's model and build the worker.  ``since_ms``: Redis time at which
        this run began; older entries in the frames streams are an earlier run's."""
        settings = self._resources.analytics
        if settings.cameras():
            import_meanwhile()
        for plan in self._plans:
            detector = self._detector_factory(self._config, plan.device)
            self._detectors.append(detector)
            context = self._context(plan)
            changes = CameraChanges()
            if self._leased:
                self._keeper = self._lease_keeper(context, changes)
            self._workers.append(self._worker(plan, context, changes, detector, since_ms))
            self._label = detector.info.label
        for camera in settings.cameras():  # a class the model lacks is bad input, found now
            self.check_analytics(camera, settings.get(camera))

    def start(self) -> None:
        for plan, worker in zip(self._plans, self._workers, strict=True):
            thread = threading.Thread(
                target=self._run_worker, args=(worker,), name=f"fb-batcher-{plan.device}"
            )
            self._threads.append(thread)
            thread.start()

    def tick(self) -> None:
        if self._keeper is not None:
            self._keeper.tick()

    def done(self) -> bool:
        """Every worker has finished (``until_done``: its cameras ended), or one failed."""
        return bool(self._failures) or not any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """The decoders of this process were told to stop: the workers read on, for at most
        ``DRAIN_S``, until each camera's end entry, so the summary says how every camera ended
        (a leased worker, whose decoders run elsewhere, and a pool with a failed worker stop
        reading at once); then they finish the batches in flight, their cameras' leases kept
        meanwhile, and (none failed) the others take the cameras over at once."""
        if not self._leased and not self._failures:
            self._finish.set()
            self._join(until=time.monotonic() + DRAIN_S)
        self._halt.set()
        self._join()
        if self._keeper is not None and not self._failures:
            self._keeper.leave()

    def _join(self, until: float | None = None) -> None:
        """Wait for every worker (until then), renewing the leases meanwhile."""
        for thread in self._threads:
            while thread.is_alive() and (until is None or time.monotonic() < until):
                thread.join(JOIN_TICK_S)
                if self._keeper is not None:
                    self._keeper.keep_alive()

    def raise_failure(self) -> None:
        if self._failures:
            raise self._failures[0]

    def close(self) -> None:
        for detector in self._detectors:
            detector.close()

    # --- what the rest of the run asks --------------------------------------------------------
    @property
    def instances(self) -> int:
        """Instances of the model over every worker."""
        return sum(worker.instances for worker in self._workers)

    def label(self, class_id: int) -> str:
        return self._label(class_id)

    def assign(self, camera: str, rules: CameraRules) -> None:
        """Read a camera added live: on the worker that had it before (its reader may still
        hold the stream), else on the one with the fewest active cameras."""
        worker = self._owner.get(camera)
        if worker is None:
            load = {id(w): 0 for w in self._workers}
            for active in self._active:
                load[id(self._owner[active])] += 1
            worker = min(self._workers, key=lambda w: load[id(w)])
        self._owner[camera] = worker
        self._active.add(camera)
        worker.changes.add(camera, rules)

    def set_rules(self, camera: str, rules: CameraRules) -> None:
        self._owner[camera].changes.set_rules(camera, rules)

    def check_analytics(self, camera: str, config: AnalyticsConfig | None) -> None:
        """Raises :class:`BadInput` for analytics settings the loaded model cannot follow."""
        analyser = self._workers[0].analyser() if self._workers else None
        if analyser is not None and config is not None:
            analyser.check(camera, config)

    def analytics(self, camera: str) -> AnalyticsConfig | None:
        """The camera's analytics settings now (any thread)."""
        return self._resources.analytics.get(camera)

    def set_analytics(self, camera: str, config: AnalyticsConfig | None) -> None:
        """A camera's analytics settings changed (its worker picks them up with its next
        frame, carrying its tracks and counts on)."""
        self.check_analytics(camera, config)
        self._resources.analytics.set(camera, config)

    def draining(self, camera: str) -> None:
        """A camera being removed: read until drained, no longer a worker's load."""
        self._active.discard(camera)

    def forget(self, camera: str) -> None:
        """Read no more of a camera removed live (every frame it sent is counted)."""
        self._active.discard(camera)
        self._owner[camera].changes.forget(camera)

    # --- a leased worker's cameras, as the registry has them ----------------------------------
    def follow(self, camera: CameraConfig) -> None:
        """A camera registered (or changed): competed for through the leases, with these
        settings; the worker holding it takes new ones with its next frame."""
        assert self._keeper is not None, "a leased pool's"
        self.check_analytics(camera.id, camera.analytics)
        rules = camera_rules(self._config, camera, until_done=False)
        known = camera.id in self._lease_rules
        self._lease_rules[camera.id] = rules
        self._resources.analytics.set(camera.id, camera.analytics)
        if known and self._keeper.holds(camera.id):
            self._workers[0].changes.set_rules(camera.id, rules)
        self._keeper.add_camera(camera.id)

    def drained(self, camera: str) -> bool:
        """For a camera whose decoder has stopped: this worker holds it, every entry of its
        stream is read and acknowledged, and every frame it read is finished; it may be
        retired."""
        if self._keeper is None or not self._keeper.holds(camera):
            return False
        if self._resources.accounting.outstanding(camera):
            return False
        return all_read(self._resources.redis_client, self._resources.keys.frames(camera))

    def unfollow(self, camera: str) -> None:
        """A camera retired from the registry: never read again."""
        assert self._keeper is not None, "a leased pool's"
        self._keeper.drop_camera(camera)
        self._lease_rules.pop(camera, None)

    # --- inside -------------------------------------------------------------------------------
    def _context(self, plan: WorkerPlan) -> WorkerContext:
        resources = self._resources
        return WorkerContext(
            redis=resources.redis_client,
            keys=resources.keys,
            accounting=resources.accounting,
            # a leased worker's consumer name is its id, which holds its leases and fences
            # its position writes
            acks=FrameAcks(
                redis_client=resources.redis_client,
                keys=resources.keys,
                ledger_maxlen=self._config.redis.detections_maxlen,
                lease_holder=plan.consumer if self._leased else None,
            ),
            telemetry=resources.telemetry,
            consumer=plan.consumer,
        )

    def _worker(
        self,
        plan: WorkerPlan,
        context: WorkerContext,
        changes: CameraChanges,
        detector: Detector,
        since_ms: int,
    ) -> BatchWorker:
        """One worker over its share of the cameras, its policy seeded with t(b)."""
        config = self._config
        policy = batching_policy(config, until_done=self._until_done)
        sizes = seeded_sizes(config.batching)
        for size, seconds in detector.time_batches(sizes, run_shape(config, detector.info)):
            policy.observe(size, seconds)  # the policy knows t(b) before the first frame
        self._active.update(plan.cameras)
        worker = BatchWorker(
            context,
            cameras=plan.cameras,
            detector=detector,
            policy=policy,
            sink=self._resources.sink,
            until_done=self._until_done,
            since_ms=since_ms,
            frame_decoder=FrameDecoder(host=host_id()),
            changes=changes,
            leases=self._keeper,
            analytics=self._resources.analytics,
            events_maxlen=config.redis.events_maxlen,
        )
        self._owner.update(dict.fromkeys(plan.cameras, worker))
        return worker

    def _lease_keeper(self, context: WorkerContext, changes: CameraChanges) -> LeaseKeeper:
        """The worker's leases, once no running worker has its id: the same id restarted (a
        pod's container) waits out its old heartbeat; one that is still renewed belongs to
        another running worker."""
        client, keys, worker_id = context.redis, context.keys, context.consumer
        ttl_s = self._config.redis.lease_ttl_s
        wait_for_worker_id(client, keys, worker_id, role=DETECTORS, ttl_s=ttl_s, stop=self._stop)
        cameras = [camera.id for camera in self._config.cameras]
        leases = CameraLeases(
            client, keys, worker_id, cameras, ttl_s=self._config.redis.lease_ttl_s
        )
        self._lease_rules.update(
            (camera.id, camera_rules(self._config, camera, until_done=self._until_done))
            for camera in self._config.cameras
        )
        return LeaseKeeper(
            context, leases=leases, changes=changes, rules=self._lease_rules.__getitem__
        )

    def _run_worker(self, worker: BatchWorker) -> None:
        try:
            worker.run(self._halt, self._finish)
        except BaseException as exc:  # noqa: BLE001 - the supervisor ends the run with it
            self._failures.append(exc)
