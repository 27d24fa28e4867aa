"""What every role of a framebatch process opens first: Redis (the configured one, or a private
redis-server), its clients, the accounting, the telemetry exporters and the control surface the
HTTP API and the metrics read."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client import CollectorRegistry

from detectors.base import parse_device
from pipeline.config import CameraConfig, Config
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.serve.control import CameraStates, Control
from pipeline.serve.live_view import LiveFrames
from pipeline.serve.metrics import PrometheusTelemetry, StateCollector
from pipeline.telemetry import GuardedTelemetry, Telemetry
from streams.embedded_redis import EmbeddedRedis
from streams.groups import ensure_group
from streams.keys import StreamKeys
from streams.redis_access import RedisAccessError, check_access, describe_redis_error
from streams.redis_connect import CONNECT_TIMEOUT_S, connect
from streams.shm_ring import remove_segments
from streams.transport import host_id

#: Further start-up probes of a role's Redis rights (``streams.redis_access.check_access``).
Probes = Callable[[redis.Redis, str], list[tuple[str, Callable[[], Any]]]]


@dataclass(frozen=True)
class Services:
    """Open for the whole run; closed by the run's exit stack."""

    redis_url: str
    keys: StreamKeys
    client: redis.Redis  # rides out Redis outages for ``redis.reconnect_timeout_s``
    accounting: Accounting
    telemetry: Telemetry  # the caller's and the exporters, each guarded
    metrics: PrometheusTelemetry
    live: LiveFrames  # the live view's newest frames (an exporter only while served)
    registry: CollectorRegistry
    control: Control
    acks: FrameAcks
    #: answers at once or fails (no riding out): for what must not hold up the supervisor's
    #: tick, the probes and the scrapes
    fail_fast: redis.Redis

    @property
    def states(self) -> CameraStates:
        return self.control.states

    def show_camera(self, camera: CameraConfig) -> None:
        """A camera of this run in the API's list and the metrics (at zero until its first
        frame)."""
        self.states.add(camera.id, camera.url, camera.priority, camera.is_live, camera.paced)
        self.metrics.add_camera(camera.id)


def open_services(
    config: Config,
    stack: ExitStack,
    *,
    telemetry: Telemetry,
    live_view: bool,
    probes: Probes | None = None,
) -> Services:
    """Redis reached and checked (bad input at start, a URL, a password, an ACL, TLS, is one
    line and exit 2, at once; from here on every client rides out an outage), each camera's
    frames group made, and the run's bookkeeping.  ``live_view``: the HTTP endpoint serves the
    live view, so it hears of every frame."""
    redis_url = config.redis.url or stack.enter_context(EmbeddedRedis()).url
    keys = StreamKeys(config.redis.prefix)

    def connect_here(**options: Any) -> redis.Redis:
        return connect(redis_url, cluster=config.redis.cluster, **options)

    try:  # a cluster client reads the slot map at once
        probe = connect_here(reconnect_timeout_s=0, socket_timeout_s=CONNECT_TIMEOUT_S)
    except redis.RedisError as exc:
        raise RedisAccessError(describe_redis_error(exc, redis_url)) from None
    with closing(probe):
        check_access(probe, keys, url=redis_url, more=probes)
    client = connect_here(reconnect_timeout_s=config.redis.reconnect_timeout_s)
    stack.callback(client.close)
    # What an earlier run left in a frames stream stays: the batcher acknowledges those
    # entries and counts their frames as previous_run (a replay too), never deletes them
    # unseen, and never processes them as this run's.
    for camera in config.cameras:
        ensure_group(client, keys.frames(camera.id))
    remove_segments(keys.prefix, host=host_id())  # shm rings of processes that died
    registry = CollectorRegistry()
    metrics, live = PrometheusTelemetry(registry), LiveFrames()
    exporters = (metrics, live) if live_view else (metrics,)
    guarded = GuardedTelemetry(telemetry, *exporters)
    accounting = Accounting(
        [camera.id for camera in config.cameras],
        max_batch_size=config.batching.max_batch_size,
        telemetry=guarded,
    )
    # probes and scrapes must not ride out an outage
    status_client = connect_here(reconnect_timeout_s=0, socket_timeout_s=CONNECT_TIMEOUT_S)
    stack.callback(status_client.close)
    control = Control(
        accounting=accounting,
        states=CameraStates(),
        redis_client=status_client,
        keys=keys,
        # a tick may wait out a Redis outage: not a dead supervisor
        max_silence_s=config.redis.reconnect_timeout_s + 10,
    )
    stack.callback(control.stopped)
    devices = [parse_device(device) for device in config.model.worker_devices]
    gpus = [index for kind, index in devices if kind == "cuda" and index is not None]
    registry.register(StateCollector(control, metrics.utilization, gpus))
    acks = FrameAcks(redis_client=client, keys=keys, ledger_maxlen=config.redis.detections_maxlen)
    services = Services(
        redis_url=redis_url,
        keys=keys,
        client=client,
        accounting=accounting,
        telemetry=guarded,
        metrics=metrics,
        live=live,
        registry=registry,
        control=control,
        acks=acks,
        fail_fast=status_client,
    )
    for camera in config.cameras:
        services.show_camera(camera)
    return services
