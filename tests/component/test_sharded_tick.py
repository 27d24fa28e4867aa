"""A decode worker's tick on a real redis-server: when starting the decoders of the cameras it
took runs past its next lease tick, that lease tick runs in the same supervisor tick (a dead
worker's cameras taken then, and started), not after the supervisor's other parts and its wait.

The decoders are a ``FakeDecoders`` (what ``ShardedDecoders`` asks of them, as pure logic): the
leases, the registry and the sessions' claims are the real ones."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config import CameraConfig, Config
from pipeline.fleet.registry import CameraRegistry
from pipeline.fleet.sharded import ShardedDecoders
from pipeline.leases.camera_leases import DECODERS, CameraLeases, rendezvous_owner
from streams.fence import DecodeLease
from streams.keys import StreamKeys

CAMERAS = [f"cam{i}" for i in range(8)]
TTL_S = 3.0
LEASE_TICK_S = min(TTL_S / 3, 1.0)  # ``CameraLeases.tick_s``


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeDecoders:
    """Decoders that start at once, and whose start runs ``on_start`` (as a slow one would let
    time and the other workers go on)."""

    on_start: list = field(default_factory=list)
    started: list[list[str]] = field(default_factory=list)  # each add_all's cameras

    def add_all(self, cameras: list[CameraConfig]) -> None:
        self.started.append(sorted(c.id for c in cameras))
        for step in self.on_start:
            step()

    def decoding(self, camera: str) -> bool:
        return any(camera in started for started in self.started)

    known = running = decoding

    def decoding_cameras(self) -> list[str]:
        return sorted(c for started in self.started for c in started)

    def done(self) -> bool:
        return False


@dataclass
class FakeServices:
    fail_fast: object
    keys: StreamKeys
    shown: list[str] = field(default_factory=list)

    @property
    def states(self) -> FakeServices:
        return self

    def state(self, camera: str) -> None:
        return None

    def show_camera(self, camera: CameraConfig) -> None:
        self.shown.append(camera.id)


def test_a_lease_tick_due_while_decoders_start_runs_in_the_same_tick(redis_client, prefix):
    keys = StreamKeys(prefix)
    config = Config.model_validate(
        {
            "model": {"path": "unused.onnx"},
            "cameras": [{"id": c, "url": f"rtsp://127.0.0.1:9/{c}"} for c in CAMERAS],
            "redis": {"lease_ttl_s": TTL_S},
        }
    )
    CameraRegistry(redis_client, keys).seed(config.cameras)
    other = CameraLeases(redis_client, keys, "b", CAMERAS, ttl_s=TTL_S, role=DECODERS)
    other.tick()  # the only decode worker: it takes every camera
    assert other.held == set(CAMERAS)

    clock, decoders = SimulatedClock(), FakeDecoders()
    worker = ShardedDecoders(
        config,
        decoders,  # type: ignore[arg-type]
        FakeServices(redis_client, keys),  # type: ignore[arg-type]
        lease=DecodeLease("a", int(TTL_S * 1000)),
        clock=clock,
    )
    worker.tick()  # registers; its share is the other's still
    assert decoders.started == []
    for camera in other.tick().handing_over:  # the other sees it, hands its share over
        other.release(camera)
    share = sorted(c for c in CAMERAS if rendezvous_owner(c, ["a", "b"]) == "a")
    rest = sorted(set(CAMERAS) - set(share))
    assert share and rest

    def the_other_dies_and_time_passes() -> None:
        if len(decoders.started) == 1:  # while the first cameras start
            redis_client.delete(*(keys.decode_lease(c) for c in rest))  # its leases run out
            redis_client.zrem(keys.decode_workers(), "b")
            clock.now += 2 * LEASE_TICK_S  # past the next lease tick

    decoders.on_start.append(the_other_dies_and_time_passes)
    clock.now += 2 * LEASE_TICK_S
    worker.tick()
    assert decoders.started == [share, rest]  # the dead one's, taken and started in this tick
    assert {(redis_client.get(keys.decode_lease(c)) or b"").decode() for c in CAMERAS} == {"a"}
