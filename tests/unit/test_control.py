"""Camera states from decoder events, throughput, and commands carried out on the supervisor's
thread (pure logic; no Redis is touched)."""

from __future__ import annotations

import threading

import pytest

from pipeline.cli.progress import render
from pipeline.ledger.accounting import Accounting
from pipeline.serve.control import CameraConflict, CameraStates, Control
from streams.keys import StreamKeys


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_states_follow_the_decoders_events_until_removed():
    states = CameraStates()
    states.add("a", "rtsp://user:secret@cam/1", priority=2, live=True)
    assert states.state("a") == "starting"
    for event, state in [
        ("opened", "running"),
        ("reconnecting", "reconnecting"),
        ("opened", "running"),
        ("bogus", "running"),
        ("ended", "ended"),
    ]:
        states.on_event({"camera": "a", "event": event})
        assert states.state("a") == state
    states.on_event({"camera": "a", "event": "error"})
    states.on_event({"camera": "a", "event": "ended"})
    assert states.state("a") == "failed"  # a source that failed, then ended, stays failed
    states.set("a", "removed")
    states.on_event({"camera": "a", "event": "opened"})
    assert states.state("a") == "removed"  # a late event does not bring it back
    [view] = states.views({})
    assert "secret" not in view.url and view.priority == 2 and view.live


def test_fps_is_the_processed_rate_of_the_last_seconds():
    clock = FakeClock()
    states = CameraStates(clock)
    states.add("a", "/clip.mp4", priority=0, live=False)
    for second in range(20):
        clock.now = float(second)
        states.sample({"a": second * 10, "unknown": 5})
    [view] = states.views({})
    assert view.fps == pytest.approx(10.0)


def test_commands_run_on_the_ticking_thread_and_errors_travel_back():
    control = Control(
        accounting=Accounting(["a"]), states=CameraStates(), redis_client=None, keys=StreamKeys()
    )
    ran_on: list[str] = []
    stop = threading.Event()

    def supervisor():
        while not stop.wait(0.01):
            control.tick()

    thread = threading.Thread(target=supervisor, name="supervisor")
    thread.start()
    try:
        assert control.submit(lambda: ran_on.append(threading.current_thread().name) or 7) == 7
        assert ran_on == ["supervisor"]
        with pytest.raises(CameraConflict, match="in use"):
            control.submit(lambda: (_ for _ in ()).throw(CameraConflict("in use")))
        assert control.alive()
    finally:
        stop.set()
        thread.join()
    control.stopped()
    with pytest.raises(CameraConflict, match="stopping"):
        control.submit(lambda: 1)


def test_progress_bars_use_the_container_total_then_the_final_count():
    states = CameraStates()
    states.add("clip", "/clip.mp4", priority=0, live=False)
    states.add("cam", "rtsp://cam/1", priority=0, live=True)
    accounting = Accounting(["clip", "cam"])
    for seq in range(5):
        accounting.on_received("clip", seq)
    accounting.on_published([("clip", 0.1, 0.0)] * 3, 1.0)
    accounting.on_shed("clip", "stale")
    summaries = {c.camera: c for c in accounting.summary().cameras}
    lines = render(states.views(summaries), {"clip": 10, "cam": None})
    assert "4/10" in lines[0] and "40%" in lines[0]
    assert "0 frames" in lines[1]
    states.set("clip", "ended")  # its decoder's count (5) is the total now
    lines = render(states.views(summaries), {"clip": 10, "cam": None})
    assert "4/5" in lines[0]


def test_a_request_that_times_out_is_never_carried_out_later():
    control = Control(
        accounting=Accounting([]), states=CameraStates(), redis_client=None, keys=StreamKeys()
    )
    assert control.alive()  # before the supervisor's first tick: the model loads
    applied: list[int] = []
    with pytest.raises(TimeoutError):
        control.submit(lambda: applied.append(1), timeout_s=0.05)  # nobody ticks
    control.tick()
    assert applied == []  # the client was told it failed: it must not happen behind its back
    with pytest.raises(TimeoutError):
        control.submit(lambda: applied.append(2), timeout_s=0.05)
    control.stopped()  # a given-up request still queued when the run ends: no error here
    assert applied == []


def test_the_host_header_names_a_loopback_client_or_not():
    from pipeline.serve.http import LOOPBACK_NAMES, host_name

    local = ["127.0.0.1:9108", "localhost:9108", "[::1]:9108", "localhost", "[::1]"]
    assert all(host_name(h) in LOOPBACK_NAMES for h in local)
    foreign = ["evil.example:9108", "127.0.0.1.evil.example", "", "[::2]:1"]
    assert not any(host_name(h) in LOOPBACK_NAMES for h in foreign)
