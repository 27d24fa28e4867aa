"""The lifecycle the batch worker's stages share: hand-offs end when a stage dies, and the
first failure is the one reported."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.errors import EXIT_RUN_FAILED, RunFailed, StageFailed
from pipeline.stages.inferer import InferenceMeter
from pipeline.stages.lifecycle import Handoff, Lifecycle
from pipeline.telemetry import GuardedTelemetry, Telemetry


def test_items_pass_in_order_until_closed():
    lifecycle = Lifecycle(threading.Event())
    handoff: Handoff[int] = lifecycle.handoff()
    received: list[int] = []
    lifecycle.start("consume", lambda: received.extend(handoff))
    for item in range(5):
        handoff.put(item)
    handoff.close()
    lifecycle.join()
    assert received == [0, 1, 2, 3, 4]
    lifecycle.raise_failure()  # nothing failed: no error


def test_several_takers_get_each_item_once_and_every_one_the_end():
    lifecycle = Lifecycle(threading.Event())
    handoff: Handoff[int] = lifecycle.handoff()
    taken: list[list[int]] = [[], [], []]
    for index in range(3):
        lifecycle.start(f"take-{index}", lambda mine=taken[index]: mine.extend(handoff))
    for item in range(30):
        handoff.put(item)
    handoff.close()
    started = time.monotonic()
    lifecycle.join()  # every taker saw the end: none is left waiting
    assert time.monotonic() - started < 2
    assert sorted(item for mine in taken for item in mine) == list(range(30))
    lifecycle.raise_failure()


def test_a_put_waits_for_the_next_stage_and_holds_one_item():
    lifecycle = Lifecycle(threading.Event())
    handoff: Handoff[int] = lifecycle.handoff()
    handoff.put(1)
    assert not handoff.free
    blocked = threading.Thread(target=handoff.put, args=(2,))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # the next stage has not taken the first item
    items = iter(handoff)
    assert next(items) == 1
    blocked.join(2)
    assert not blocked.is_alive() and next(items) == 2


@pytest.mark.parametrize("waiting", ["put", "get"])
def test_a_failed_stage_releases_every_waiting_stage(waiting: str):
    class FailureTelemetry(Telemetry):
        stages: list[str] = []

        def stage_failed(self, stage, error):
            self.stages.append(stage)

    telemetry = FailureTelemetry()
    lifecycle = Lifecycle(threading.Event(), telemetry)
    handoff: Handoff[int] = lifecycle.handoff()
    if waiting == "put":
        handoff.put(0)  # full: the next put waits
        lifecycle.start("wait", lambda: handoff.put(1))
    else:
        lifecycle.start("wait", lambda: list(handoff))

    def die() -> None:
        time.sleep(0.2)
        raise RuntimeError("boom")

    lifecycle.start("die", die)
    started = time.monotonic()
    lifecycle.join()
    assert time.monotonic() - started < 2
    with pytest.raises(StageFailed, match="batcher die stage failed: RuntimeError: boom"):
        lifecycle.raise_failure()
    assert telemetry.stages == ["die"]


def test_the_first_failure_is_reported():
    lifecycle = Lifecycle(threading.Event())
    lifecycle.fail("publish", ConnectionError("first"))
    lifecycle.fail("infer", RuntimeError("second"))
    with pytest.raises(StageFailed, match="publish.*first") as info:
        lifecycle.raise_failure()
    assert isinstance(info.value, RunFailed) and info.value.exit_code == EXIT_RUN_FAILED
    assert isinstance(info.value.__cause__, ConnectionError)


def test_the_meter_says_how_long_the_running_batch_has_left():
    meter = InferenceMeter()
    assert meter.busy_for(lambda size: 1.0) == 0.0  # idle
    meter.started(4)
    left = meter.busy_for(lambda size: 0.25 * size)
    assert 0.9 < left <= 1.0
    seconds = meter.finished()
    assert meter.busy_for(lambda size: 1.0) == 0.0
    assert list(meter.samples()) == [(4, seconds)] and list(meter.samples()) == []


def test_an_exporter_that_raises_loses_its_event_only(caplog):
    class BrokenTelemetry(Telemetry):
        def stage_failed(self, stage, error):
            raise RuntimeError("exporter bug")

        def frames_dropped(self, camera, cause, count):
            raise RuntimeError("exporter bug")

    lifecycle = Lifecycle(threading.Event(), GuardedTelemetry(BrokenTelemetry()))
    lifecycle.fail("publish", ConnectionError("sink down"))
    assert lifecycle.failed

    class CountingTelemetry(Telemetry):
        dropped = 0

        def frames_dropped(self, camera, cause, count):
            self.dropped += count

    counting = CountingTelemetry()
    telemetry = GuardedTelemetry(BrokenTelemetry(), counting)
    for _ in range(3):
        telemetry.frames_dropped("a", "stale", 1)
    assert caplog.text.count("telemetry frames_dropped of") == 1
    assert counting.dropped == 3  # the next exporter still hears of every frame


def test_a_redis_password_never_shows_in_a_stage_failure():
    lifecycle = Lifecycle(threading.Event())
    lifecycle.fail("publish", ValueError("cannot reach redis://:hunter2@db:6379/0"))
    with pytest.raises(StageFailed) as info:
        lifecycle.raise_failure()
    assert "hunter2" not in str(info.value) and "redis://:***@db:6379/0" in str(info.value)


def test_with_two_instances_the_meter_waits_only_when_both_run():
    meter = InferenceMeter(instances=2)
    meter.started(8, instance=0)
    assert meter.busy_for(lambda size: 1.0) == 0.0  # instance 1 is free
    meter.started(1, instance=1)
    left = meter.busy_for(lambda size: 0.25 * size)  # 0.25 s for the batch of 1, 2 s for 8
    assert 0.15 < left <= 0.25
    meter.finished(instance=1)
    assert meter.busy_for(lambda size: 1.0) == 0.0
    meter.finished(instance=0)
    assert sorted(size for size, _ in meter.samples()) == [1, 8]
