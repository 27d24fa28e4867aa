"""Stopping decode processes (real spawned processes and pipes): what a process sends while it
stops is read while the supervisor waits for it, so one with hundreds of cameras reporting
their ends is not left blocked on a full pipe and terminated, its cameras' sessions taken for
crashed; one whose decoder hangs writes its threads' stacks to the log before it is killed."""

from __future__ import annotations

import signal
import time

from detectors.preprocess import Letterbox
from pipeline.supervisor.decoder_processes import (
    STACKS_STALE_S,
    STACKS_WAIT_S,
    DecoderProcesses,
)
from streams.decode_process import DecoderJob, ProcessSettings, write_stacks_on_signal
from streams.decode_worker import DecoderSpec

CAMERAS = 250
JOIN_S = 20.0  # far more than a process that is not blocked needs


def simulated_stopping_process(settings, stop, released, control) -> None:
    """Takes the cameras it is sent (says so); once stopped, reports each camera's end and
    exit as a decode process does (an end entry's fields are a few hundred bytes), then exits."""
    cameras = []
    while not stop.is_set():
        while control.poll(0.01):
            kind, job = control.recv()
            if kind == "start":
                cameras.append((job.spec.camera, job.run))
                control.send(("started", job.spec.camera, job.run))
    for camera, run in cameras:
        control.send(("end", camera, run, {"reason": "stopped", "note": "x" * 300}))
        control.send(("exited", camera, run, None))


def job(camera: str) -> DecoderJob:
    spec = DecoderSpec(
        camera=camera,
        url="unused.mp4",
        live=False,
        realtime=False,
        loop=False,
        backpressure=True,
        max_backlog=8,
    )
    return DecoderJob(spec=spec, redis_url="redis://unused", prefix="p", prepare=Letterbox(8, 8))


def test_a_process_stopping_hundreds_of_cameras_exits_without_being_terminated():
    processes = DecoderProcesses(
        ProcessSettings(), None, CAMERAS, target=simulated_stopping_process
    )
    for n in range(CAMERAS):
        processes.start(job(f"c{n}"))
    started = []
    deadline = time.monotonic() + 60
    while len(started) < CAMERAS and time.monotonic() < deadline:
        started += [m for m in processes.messages() if m[0] == "started"]
        time.sleep(0.05)
    assert len(started) == CAMERAS
    started = time.monotonic()
    processes.stop_and_join(JOIN_S)
    assert time.monotonic() - started < JOIN_S  # exited by itself, not at the deadline
    [(process, last, running)] = list(processes.dead())
    assert process.process.exitcode == 0  # not terminated (-15)
    assert running == []  # every camera said it exited: none is ended as crashed
    assert sum(m[0] == "end" for m in last) == CAMERAS


def simulated_hung_process(settings, stop, released, control) -> None:
    """Takes the cameras it is sent, then hangs in a call of its own, as a decoder thread
    stuck in a read would: it never stops."""
    write_stacks_on_signal()
    while not control.poll(0.01):
        pass
    control.recv()
    control.send(("started", "hung", 1))
    a_call_that_never_returns()


def a_call_that_never_returns() -> None:
    while True:
        time.sleep(0.01)


def test_a_decode_process_that_does_not_stop_writes_its_stacks_then_is_killed(capfd):
    processes = DecoderProcesses(ProcessSettings(), None, 4, target=simulated_hung_process)
    processes.start(job("hung"))
    deadline = time.monotonic() + 60
    while not any(m[0] == "started" for m in processes.messages()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    asked = time.monotonic()
    assert not processes.kill_process_of("hung", asked)  # its stacks first
    stacks = ""
    deadline = time.monotonic() + 30
    while "a_call_that_never_returns" not in stacks:  # where it hung, in the log
        assert time.monotonic() < deadline, stacks
        time.sleep(0.05)
        stacks += capfd.readouterr().err
    assert not processes.kill_process_of("hung", asked + STACKS_WAIT_S / 2)
    later = asked + STACKS_STALE_S * 2  # a hang long after a first one: its own stacks
    assert not processes.kill_process_of("hung", later)
    assert not processes.kill_process_of("hung", later + STACKS_WAIT_S / 2)
    asked = later
    assert processes.kill_process_of("hung", asked + STACKS_WAIT_S)
    [(process, _last, running)] = wait_for_dead(processes)
    assert process.process.exitcode == -signal.SIGKILL
    assert running == [("hung", 1)]


def wait_for_dead(processes: DecoderProcesses) -> list:
    deadline = time.monotonic() + 30
    while not (dead := list(processes.dead())):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return dead
