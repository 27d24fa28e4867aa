"""Which decode process decodes which camera: cameras are placed on processes of up to
``cameras_per_process`` threads each (:mod:`streams.decode_process`), a new process started
only when every running one is full.  Owned by the decoder supervisor's thread."""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from streams.decode_process import (
    STACKS_SIGNAL,
    DecoderJob,
    Message,
    ProcessSettings,
    run_decoder_process,
)
from streams.decode_worker import ProcessFlag

log = logging.getLogger(__name__)

#: how long a hung decode process is given to write its threads' stacks before it is killed
#: (they were cut short at 0.3 s on a starved host with a hundred threads)
STACKS_WAIT_S = 1.0
STACKS_STALE_S = 10 * STACKS_WAIT_S


class Outbox:
    """Jobs and stops for one decode process, sent by a thread of its own: a process still
    starting (its imports take seconds on a starved host) or busy opening cameras leaves its
    pipe full, and a send then waits; the supervisor's tick, which renews the decode leases,
    waited 1-4 s so with 200 cameras to start, and the worker's heartbeat ran out."""

    def __init__(self, control: Connection, name: str):
        self._control = control
        self._name = name
        self._messages: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        threading.Thread(target=self._send_each, name=name, daemon=True).start()

    def put(self, message: Message) -> None:
        self._messages.put(message)

    def close(self) -> None:
        """No more messages (the process is gone or stopped: what is still queued is not
        sent)."""
        self._messages.put(None)

    def _send_each(self) -> None:
        while (message := self._messages.get()) is not None:
            try:
                self._control.send(message)
            except OSError:
                return  # it died: found dead on the next tick, its cameras with it
            except Exception:  # a message that cannot be sent: said, and the next ones go on
                log.exception("%s: a %s message not sent", self._name, message[0])


@dataclass
class DecodeProcess:
    process: BaseProcess
    control: Connection  # both ways: jobs and stops to it, end entries and exits from it
    outbox: Outbox  # what is sent on ``control``
    stop: ProcessFlag  # its own: a decoder killed while waiting cannot hang set()
    cameras: dict[str, int] = field(default_factory=dict)  # threads not exited yet: their run
    stopping: bool = False
    stacks_asked_at: float | None = None  # a decoder would not stop: the process is killed
    received: list[Message] = field(default_factory=list)  # read from ``control``, not yet asked

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid


class DecoderProcesses:
    def __init__(
        self,
        settings: ProcessSettings,
        released: ProcessFlag | None,
        cameras_per_process: int,
        *,
        target: Callable[..., None] = run_decoder_process,
    ):
        """``target``: each process's entry point (``run_decoder_process``'s arguments)."""
        self._target = target
        self._settings = settings
        self._released = released
        self._per_process = cameras_per_process
        self._processes: list[DecodeProcess] = []
        self._context = multiprocessing.get_context("spawn")

    def start(self, job: DecoderJob) -> None:
        """The camera's thread, on a running process with room, else on a new one."""
        camera = job.spec.camera
        placed = (
            next(
                (
                    p
                    for p in self._processes
                    if not p.stopping
                    and p.process.is_alive()
                    and camera not in p.cameras  # a camera removed and back may still be draining
                    and len(p.cameras) < self._per_process
                ),
                None,
            )
            or self._spawn()
        )
        placed.cameras[camera] = job.run
        placed.outbox.put(("start", job))

    def stop_camera(self, camera: str) -> None:
        for process in self._processes:
            if camera in process.cameras:
                process.outbox.put(("stop", camera))

    def stop_all(self) -> None:
        for process in self._processes:
            process.stopping = True
            process.stop.set()

    def running(self, camera: str) -> bool:
        """The camera's thread has not exited, on a process that has not died."""
        return any(camera in p.cameras and p.process.is_alive() for p in self._processes)

    def messages(self) -> Iterator[Message]:
        """What the processes reported since last asked (an exit also frees the camera's
        place)."""
        for process in self._processes:
            yield from self._drain(process)

    def dead(self) -> Iterator[tuple[DecodeProcess, list[Message], list[tuple[str, int]]]]:
        """Processes that exited, each with its last messages and the cameras (and runs) whose
        threads were still running then (the sessions it took down; none for a process that
        ended cleanly); they are forgotten."""
        for process in list(self._processes):
            if process.process.is_alive():
                continue
            process.process.join()
            last = list(self._drain(process))
            self._processes.remove(process)
            process.outbox.close()
            process.control.close()
            yield process, last, sorted(process.cameras.items())

    def kill_process_of(self, camera: str, now: float) -> bool:
        """Kills the process of a camera whose decoder does not stop: the first call asks it
        for its threads' stacks (written to the log, to say where it hangs) and returns False;
        a call ``STACKS_WAIT_S`` later kills it and returns True."""
        for process in self._processes:
            if camera not in process.cameras:
                continue
            asked = process.stacks_asked_at
            # asked long ago, for a hang its decoders came out of: this hang's stacks first
            if asked is None or now - asked > STACKS_STALE_S:
                process.stacks_asked_at = now
                _ask_for_stacks(process, camera)
                return False
            if now - process.stacks_asked_at < STACKS_WAIT_S:
                return False
            others = sorted(set(process.cameras) - {camera})
            log.warning(
                "camera %s: decoder did not stop, its process killed (its other cameras "
                "end with it, and live ones restart: %s)",
                camera,
                ", ".join(others) or "none",
            )
            process.process.kill()
        return True

    def stop_and_join(self, timeout_s: float) -> None:
        """Every process stopped and joined (stop → join → terminate → kill: none is left
        behind); what they said, and which exited, is still there to be read (:meth:`dead`).
        What they send while stopping is read meanwhile: a process whose 250 cameras each
        reported their end filled its pipe, waited on it, and was terminated 5 s later, its
        cameras' sessions ended as crashed."""
        self.stop_all()
        deadline = time.monotonic() + timeout_s
        while (alive := [p for p in self._processes if p.process.is_alive()]) and (
            left := deadline - time.monotonic()
        ) > 0:
            wait([p.control for p in alive] + [p.process.sentinel for p in alive], left)
            for process in alive:
                self._receive(process)
        for process in self._processes:
            if process.process.is_alive():
                process.process.terminate()
                process.process.join(2.0)
            if process.process.is_alive():
                process.process.kill()
            process.process.join()

    def close(self, timeout_s: float) -> list[int]:
        """Every process stopped, joined and forgotten; the pids they had."""
        self.stop_and_join(timeout_s)
        pids = [p.pid for p in self._processes]
        for process in self._processes:
            process.outbox.close()
            process.control.close()
        self._processes = []
        return pids

    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    # --- inside -------------------------------------------------------------------------------
    def _spawn(self) -> DecodeProcess:
        ours, theirs = self._context.Pipe(duplex=True)
        stop = ProcessFlag()
        process = self._context.Process(
            target=self._target,
            args=(self._settings, stop, self._released, theirs),
            name=f"fb-decoders-{len(self._processes)}",
            daemon=True,
        )
        process.start()
        theirs.close()  # the process holds its own copy
        spawned = DecodeProcess(process, ours, Outbox(ours, f"{process.name}-outbox"), stop)
        self._processes.append(spawned)
        return spawned

    def _drain(self, process: DecodeProcess) -> Iterator[Message]:
        self._receive(process)
        received, process.received = process.received, []
        yield from received

    @staticmethod
    def _receive(process: DecodeProcess) -> None:
        """What the process sent, moved off its pipe (an exit also frees the camera's place)."""
        while True:
            try:
                if not process.control.poll():
                    return
                message = process.control.recv()
            except (EOFError, OSError):
                return  # the process is gone and sent everything it had: nothing more to read
            except Exception:  # one message that does not unpickle: said, the next ones read
                log.exception("%s: a message from it not read", process.process.name)
                continue
            if message[0] == "exited":
                process.cameras.pop(message[1], None)
            process.received.append(message)


def _ask_for_stacks(process: DecodeProcess, camera: str) -> None:
    log.warning(
        "camera %s: decoder did not stop; its process (pid %d) writes its threads' stacks "
        "to the log, then is killed",
        camera,
        process.pid,
    )
    try:
        os.kill(process.pid, STACKS_SIGNAL)
    except OSError:
        pass  # gone already: found dead on the next tick
