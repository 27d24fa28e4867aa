"""A decode process: several cameras, one thread each (PyAV, the colour conversion and the
letterbox release the GIL while they work), told which to start and stop over a pipe.

One process per camera made every camera pay for a Python interpreter with the whole stack
imported (~56 MB, ~1.5 s of start-up CPU); a thread costs its decoder's buffers.  A camera's
thread that fails ends alone: its supervisor writes the session's end from the progress it kept
and starts it again; the process, and the other cameras in it, go on.  A crash of the process
itself (a segfault in a decoder) takes its cameras, which the supervisor restarts elsewhere.

The pipe carries, to the process, ``("start", DecoderJob)`` and ``("stop", camera)``; from it,
``("end", camera, run, fields)`` once a session's end entry is in Redis (the supervisor writes
it again should Redis lose it before it was read) and ``("exited", camera, run, error)`` when a
camera's thread is done (``error`` None, or why it failed: the session has no end entry;
``streams.fence.LEASE_LOST``: it was fenced out, its end written by whoever took it over);
``run`` is the job's, which tells a camera's thread from the one before it (removed, back).
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import cv2
import redis

from streams.decode_worker import (
    DecoderSpec,
    DecodeWorker,
    FramePreparer,
    ProcessFlag,
    StopSignal,
    wait_until_read,
)
from streams.fence import (
    LEASE_LOST,
    WORKER_GONE,
    LeaseLost,
    WorkerGone,
    leave_for_dead_worker,
)
from streams.keys import StreamKeys
from streams.lifeline import die_with_parent, parent_alive, raise_parent_gone_on
from streams.logs import configure_process_logging
from streams.redis_connect import DEFAULT_RECONNECT_TIMEOUT_S, connect
from streams.redis_errors import is_outage
from streams.transport import FrameEncoder, ShmEncoder, TransportSpec, make_encoder

log = logging.getLogger(__name__)

CONTROL_POLL_S = 0.05
M_MMAP_THRESHOLD = -3  # glibc's mallopt() parameter
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial threshold, kept from rising
LEAVE_JOIN_S = 2.0  # the daemon is gone: its cameras' threads get this long to end
ORPHAN_WAIT_S = 1.0  # the pipe closed: how long its parent may take to be seen gone
#: what makes a decode process write every thread's stack to its stderr (the daemon's log):
#: sent before one whose decoder does not stop is killed, so the log says where it hung
STACKS_SIGNAL = signal.SIGUSR1

Message = tuple  # ("start", DecoderJob) | ("stop", camera) | ("end", ...) | ("exited", ...)


@dataclass(frozen=True)
class DecoderJob:
    """Everything a camera's thread in a decode process needs, picklable: its camera, the Redis
    it writes to, how frames are prepared and how their pixels travel."""

    spec: DecoderSpec
    redis_url: str
    prefix: str
    prepare: FramePreparer  # picklable: a letterbox
    transport: TransportSpec = TransportSpec()
    cluster: bool = False  # redis_url is a node of a Redis Cluster
    reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S
    max_frame_bytes: int | None = None  # the largest prepared frame: sizes a shm ring's slots
    run: int = 1  # which start of the camera this is: its reports name it
    session: str | None = None  # claimed under the camera's decode lease (streams.fence)


@dataclass(frozen=True)
class ProcessSettings:
    """What the process itself needs from its parent."""

    parent_pid: int | None = None  # the process dies with this one, however it ends
    log_level: int = logging.INFO  # the parent's: a spawned process does not inherit it


def ring_path(encoder: FrameEncoder, transport: TransportSpec) -> Path | None:
    """Where the encoder's shm ring lives (None: it has none)."""
    return Path(transport.shm_dir) / encoder.name if isinstance(encoder, ShmEncoder) else None


def leave_when_gone(gone: ProcessFlag, rings: list[Path]) -> Callable[[], None]:
    """What a decode process does in its SIGTERM handler once its daemon is gone (or
    terminating it): set ``gone``, and unlink its cameras' shm rings' names, since nobody will
    read the rings any more.

    Unlinked there, not only by the cleanup that follows: a signal lands between any two
    bytecodes, so the exception may come as a ring is made, before its encoder holds it, or be
    dropped in a finalizer.  The names hold this process's pid: no other process owns them.
    ``rings`` grows as cameras start (a list append is atomic): the handler reads a copy."""

    def leave() -> None:
        gone.set()
        for ring in tuple(rings):
            ring.unlink(missing_ok=True)  # one system call each, no lock: safe in the handler

    return leave


class _Reports:
    """The pipe to the supervisor, shared by the cameras' threads."""

    def __init__(self, control: Connection):
        self._control = control
        self._lock = threading.Lock()

    def send(self, *message: object) -> None:
        with self._lock:
            try:
                self._control.send(message)
            except OSError:
                pass  # the supervisor is gone: nobody to tell


class _Clients:
    """One pair of Redis clients per process (each a connection pool the threads share): the
    one that rides out outages, and the fail-fast one cameras that shed send frames with."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, bool, float], tuple[redis.Redis, redis.Redis]] = {}
        self._lock = threading.Lock()

    def pair(self, job: DecoderJob) -> tuple[redis.Redis, redis.Redis]:
        key = (job.redis_url, job.cluster, job.reconnect_timeout_s)
        with self._lock:
            if key not in self._pairs:
                self._pairs[key] = (
                    connect(
                        job.redis_url,
                        reconnect_timeout_s=job.reconnect_timeout_s,
                        cluster=job.cluster,
                    ),
                    connect(job.redis_url, fail_fast=True, cluster=job.cluster),
                )
            return self._pairs[key]

    def close(self) -> None:
        for client, fail_fast in self._pairs.values():
            client.close()
            fail_fast.close()


def decode_camera(
    job: DecoderJob,
    stop: StopSignal,
    *,
    gone: ProcessFlag,
    worker_alive: Callable[[], bool],
    released: StopSignal | None,
    clients: _Clients,
    rings: list[Path],
    reports: _Reports,
) -> None:
    """A camera's thread: decode until its session ends or ``stop`` (set by the process's main
    thread for this camera alone, or for all as the process stops or its daemon is gone),
    then (shm) keep the ring until the batcher has read its frames or ``released`` is set;
    report the end entry, and always the exit (with why, unless the session ended).
    ``worker_alive``: whether the daemon lives (under a decode lease, one that ran out is
    taken back only then: ``streams.fence.SessionFence``)."""
    spec = job.spec
    error: str | None = "decoder thread ended before its session did"
    try:
        encoder = make_encoder(
            job.transport,
            redis_url=job.redis_url,
            prefix=job.prefix,
            camera=spec.camera,
            max_backlog=spec.max_backlog,
            pid=os.getpid(),
            max_frame_bytes=job.max_frame_bytes,
            max_fps=spec.max_fps,
            run=job.run,
        )
        ring = ring_path(encoder, job.transport)
        if ring is not None:
            rings.append(ring)
        try:
            error = _decode(job, stop, encoder, clients, reports, worker_alive)
        finally:
            _release(job, encoder, error, clients, gone, released)
            if ring is not None:
                rings.remove(ring)
    except Exception as exc:  # noqa: BLE001 (one camera's failure must not end the others)
        error = _failure(spec.camera, exc)
    finally:
        reports.send("exited", spec.camera, job.run, error)


def _decode(
    job: DecoderJob,
    stop: StopSignal,
    encoder: FrameEncoder,
    clients: _Clients,
    reports: _Reports,
    worker_alive: Callable[[], bool],
) -> str | None:
    """The session, to its end entry (sent); None, or why it ended without one."""
    spec = job.spec
    try:
        client, fail_fast = clients.pair(job)
        end = DecodeWorker(
            spec=spec,
            redis_client=client,
            keys=StreamKeys(job.prefix),
            prepare=job.prepare,
            encoder=encoder,
            fail_fast_client=fail_fast,
            session=job.session,
            worker_alive=worker_alive,
        ).run(stop)
    except redis.RedisError as exc:
        if not worker_alive():  # not Redis: the process closes its clients as its worker is gone
            log.warning("camera %r: its decode worker is gone; decoder stopped", spec.camera)
            return WORKER_GONE
        if not is_outage(exc):
            return _failure(spec.camera, exc)
        # the daemon fails the run for the same reason and says so once
        log.error(
            "camera %r: Redis unreachable for more than %.0f s; decoder stopped",
            spec.camera,
            job.reconnect_timeout_s,
        )
        return "Redis unreachable"
    except WorkerGone as exc:  # its worker, if it is still there to read it, ends the session
        log.warning("%s", exc)
        return WORKER_GONE
    except LeaseLost as exc:
        log.warning("%s", exc)
        return LEASE_LOST
    except Exception as exc:  # noqa: BLE001 (one camera's failure must not end the others)
        return _failure(spec.camera, exc)
    reports.send("end", spec.camera, job.run, end.to_fields())
    return None


def _release(
    job: DecoderJob,
    encoder: FrameEncoder,
    error: str | None,
    clients: _Clients,
    gone: ProcessFlag,
    released: StopSignal | None,
) -> None:
    """The encoder closed: a shm ring once its frames are read (or nobody will read them)."""
    try:
        if encoder.holds_frames and error is None and not gone.is_set():
            client, _ = clients.pair(job)
            wait_until_read(
                client, StreamKeys(job.prefix).frames(job.spec.camera), released, gone=gone
            )
    except redis.RedisError:
        pass  # nobody can read the frames now: the ring goes
    finally:
        encoder.close()


def _failure(camera: str, exc: BaseException) -> str:
    log.error(
        "camera %r: decoder failed\n%s", camera, "".join(traceback.format_exception(exc)).strip()
    )
    return f"{type(exc).__name__}: {exc}"


def keep_frame_buffers_apart() -> None:
    """glibc raises its mmap threshold as large blocks are freed (up to 32 MB), after which
    frame-sized buffers come from the heaps of the threads' arenas and stay there, fragmented;
    held at 128 KB, each is a mapping of its own, given back when freed.  Measured with 8
    cameras in a process: 16 -> 11 MB of PSS per camera beyond the first (docs/benchmarks.md).
    Elsewhere than glibc, nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass  # not glibc


def write_stacks_on_signal() -> None:
    """``STACKS_SIGNAL`` makes this process write every thread's stack to its stderr, from the
    signal handler in C (a thread that holds the GIL for ever does not stop it)."""
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)


def run_decoder_process(
    settings: ProcessSettings,
    stop: StopSignal,
    released: StopSignal | None,
    control: Connection,
) -> None:
    """Process entry point: cameras start and stop as the pipe says, until ``stop`` (then
    every camera ends its session and the process exits once they all have).  The parent
    coordinates shutdown, so SIGINT is ignored here; with ``settings.parent_pid`` the process
    dies with its parent (SIGKILL of the daemon included), and a SIGTERM, from the kernel or
    the supervisor, unlinks the rings on the way out; its parent dead, it lets go of the
    leases of the cameras it decoded (:func:`_leave_for_dead_worker`)."""
    configure_process_logging(settings.log_level)  # the daemon's format, time stamps included
    write_stacks_on_signal()
    keep_frame_buffers_apart()
    # the parent died or is terminating this process: ParentGone says so, and so does this
    # flag, which the main loop (it stops the cameras) and each ring's release look at, should
    # the exception be dropped in a finalizer; lock-free (a signal handler that takes a lock
    # deadlocks when a second signal interrupts it)
    gone = ProcessFlag()
    rings: list[Path] = []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # one thread per decoder: the cameras run side by side already, and OpenCV's own pool
    # made the letterbox's resize cost 2.0 instead of 1.1 ms of CPU a frame (docs/benchmarks.md)
    cv2.setNumThreads(0)
    # the pipe's end closed before the parent-death signal came: the cleanup has begun, and
    # the signal, handled at any bytecode of it, must not cut it short (the last will with it)
    leaving = ProcessFlag()
    if settings.parent_pid is not None:
        raise_parent_gone_on(
            signal.SIGTERM,
            parent_pid=settings.parent_pid,
            stopping=stop.is_set,
            on_gone=leave_when_gone(gone, rings),
            leaving=leaving.is_set,
        )
        die_with_parent(settings.parent_pid, signal.SIGTERM)
    reports, clients = _Reports(control), _Clients()
    cameras: dict[str, tuple[threading.Thread, threading.Event]] = {}
    jobs: dict[str, DecoderJob] = {}  # each camera's latest

    def worker_alive() -> bool:
        """Whether the daemon lives, not only once the parent-death signal was handled (a
        starved process took seconds, and its decoders took leases back meanwhile)."""
        parent = settings.parent_pid
        return not gone.is_set() and (parent is None or parent_alive(parent))

    try:
        while not stop.is_set() and not gone.is_set():
            if not control.poll(CONTROL_POLL_S):
                continue
            kind, argument = control.recv()
            if kind == "start":
                own_stop = threading.Event()
                thread = threading.Thread(
                    target=decode_camera,
                    args=(argument, own_stop),
                    kwargs={
                        "gone": gone,
                        "worker_alive": worker_alive,
                        "released": released,
                        "clients": clients,
                        "rings": rings,
                        "reports": reports,
                    },
                    name=f"fb-decoder-{argument.spec.camera}",
                    daemon=True,
                )
                cameras[argument.spec.camera] = (thread, own_stop)
                jobs[argument.spec.camera] = argument
                thread.start()
            elif kind == "stop" and argument in cameras:
                cameras[argument][1].set()
    except (EOFError, OSError):
        leaving.set()
        gone.set()  # the supervisor's end of the pipe closed: it is gone
    finally:  # the daemon gone (ParentGone, or the flag): their sessions end, if Redis is there
        if _orphaned(settings.parent_pid, told_by_pipe=leaving.is_set()):
            for _thread, own_stop in cameras.values():
                own_stop.set()
            _leave_for_dead_worker(list(jobs.values()), clients)
        _stop_and_join(cameras, None if not gone.is_set() else LEAVE_JOIN_S)
        clients.close()


def _orphaned(parent_pid: int | None, *, told_by_pipe: bool) -> bool:
    """Whether the daemon died.  Its end of the pipe closes as it exits, a moment before the
    kernel hands its children to another parent: told by the pipe, this waits for that (or
    for ``ORPHAN_WAIT_S``, should the parent live on)."""
    if parent_pid is None:
        return False
    deadline = time.monotonic() + (ORPHAN_WAIT_S if told_by_pipe else 0.0)
    while parent_alive(parent_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not parent_alive(parent_pid)


def _leave_for_dead_worker(jobs: list[DecoderJob], clients: _Clients) -> None:
    """The daemon died (not stopped: it would have let go itself) and the decoders of these
    cameras are told to stop: their decode worker's last will
    (``streams.fence.leave_for_dead_worker``), at once, not once they stopped (a hundred
    decoders on a starved host took longer than the TTL to).  A decoder that writes after
    its lease went is fenced out (its worker is gone: it takes no free lease back), and whoever
    takes its camera ends its session from the progress it kept."""
    by_worker: dict[tuple[str, bool, str, str], list[DecoderJob]] = {}
    for job in jobs:
        if job.spec.lease is not None:
            key = (job.redis_url, job.cluster, job.prefix, job.spec.lease.worker)
            by_worker.setdefault(key, []).append(job)
    for (_url, _cluster, prefix, worker), worker_jobs in by_worker.items():
        cameras = sorted(job.spec.camera for job in worker_jobs)
        try:
            _client, fail_fast = clients.pair(worker_jobs[0])
            released = leave_for_dead_worker(fail_fast, StreamKeys(prefix), worker, cameras)
        except redis.RedisError as exc:
            log.warning(
                "decode worker %s is gone; its %d camera(s) here wait out their leases' TTL "
                "(not let go: %s)",
                worker,
                len(cameras),
                exc,
            )
            continue
        log.warning(
            "decode worker %s is gone: %d lease(s) of the %d camera(s) it decoded here let go "
            "and its heartbeat dropped, for the other decode workers to take at their next tick",
            worker,
            released,
            len(cameras),
        )


def _stop_and_join(
    cameras: dict[str, tuple[threading.Thread, threading.Event]], timeout: float | None
) -> None:
    """Each camera's own event is what its thread waits on (paced, or waiting for room):
    set here, the process's stop reaches the threads without their polling a shared flag.
    ``timeout``: for all of them together."""
    for _thread, stop in cameras.values():
        stop.set()
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread, _stop in cameras.values():
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
