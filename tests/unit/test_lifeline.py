"""A child that learns its parent is gone even when the exception saying so is dropped, or
before any signal is handled; a decoder whose daemon is gone leaves no shm ring, however many
signals say so."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from streams import transport
from streams.decode_process import leave_when_gone, ring_path
from streams.decode_worker import ProcessFlag
from streams.lifeline import ParentGone, parent_alive, raise_parent_gone_on
from streams.shm_ring import ShmRing, segment_name
from streams.transport import ShmEncoder, TransportSpec


@pytest.fixture
def restore_sigusr1():
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


class _SignalledInFinalizer:
    """Its finalizer is where the signal's handler runs: what it raises is dropped."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(1000):  # bytecodes: the handler runs among them, here
            pass


# the point of the test: the interpreter drops what the handler raises inside __del__
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_parent_gone_exception_dropped_in_a_finalizer_still_sets_the_flag(restore_sigusr1):
    gone = ProcessFlag()  # lock-free, as the decoder's
    raise_parent_gone_on(
        signal.SIGUSR1, parent_pid=os.getppid(), stopping=lambda: True, on_gone=gone.set
    )
    _SignalledInFinalizer()  # collected at once: the handler raises inside __del__
    gc.collect()
    assert gone.is_set()  # the decoder's loops stop on this flag, ParentGone or not


def test_a_parent_gone_exception_unwinds_where_it_can(restore_sigusr1):
    gone = ProcessFlag()  # lock-free, as the decoder's
    raise_parent_gone_on(
        signal.SIGUSR1, parent_pid=os.getppid(), stopping=lambda: True, on_gone=gone.set
    )
    with pytest.raises(ParentGone):
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(1000):
            pass
    assert gone.is_set()


def test_a_child_already_leaving_is_not_cut_short_by_the_parent_death_signal(restore_sigusr1):
    """Its pipe to the parent closed first: the cleanup (a decode worker's last will among
    it) has begun, and the parent-death signal handled inside it only sets the flag: a
    ParentGone raised there cut the cleanup short, the dead worker's leases never let go."""
    gone, leaving = ProcessFlag(), ProcessFlag()
    raise_parent_gone_on(
        signal.SIGUSR1,
        parent_pid=os.getppid(),
        stopping=lambda: True,
        on_gone=gone.set,
        leaving=leaving.is_set,
    )
    leaving.set()
    signalled()  # raises nothing
    assert gone.is_set()


def test_a_signal_meant_for_the_whole_group_is_ignored(restore_sigusr1):
    gone = ProcessFlag()  # lock-free, as the decoder's
    raise_parent_gone_on(
        signal.SIGUSR1, parent_pid=os.getppid(), stopping=lambda: False, on_gone=gone.set
    )
    os.kill(os.getpid(), signal.SIGUSR1)
    for _ in range(1000):
        pass
    assert not gone.is_set()


def signalled() -> None:
    """Our own signal, and bytecodes for its handler to run among (it runs here)."""
    os.kill(os.getpid(), signal.SIGUSR1)
    for _ in range(1000):
        pass


def test_parent_gone_is_raised_once_so_a_later_signal_cannot_cut_the_cleanup(restore_sigusr1):
    """A daemon that exits sends its decoders the parent-death signal again each time it hands
    them to another of its threads as they exit: each raised ParentGone, and one that landed
    in the cleanup the first had started cut it short before the ring was unlinked."""
    calls = []
    raise_parent_gone_on(
        signal.SIGUSR1,
        parent_pid=os.getppid(),
        stopping=lambda: True,
        on_gone=lambda: calls.append(1),
    )
    cleaned = False
    with pytest.raises(ParentGone):
        try:
            signalled()
        finally:
            signalled()  # the next one, in the cleanup
            cleaned = True
    assert cleaned
    assert len(calls) == 2  # each still says so: the flag is set, the ring unlinked


def shm_encoder(directory: Path) -> ShmEncoder:
    return ShmEncoder(
        name=segment_name("t", "cam", os.getpid()),
        slots=2,
        host="test-host/boot",
        directory=directory,
    )


def test_a_decoder_told_to_go_unlinks_its_ring_at_once(restore_sigusr1, tmp_path: Path):
    """The handler unlinks the ring itself: the exception it raises may be dropped (a
    finalizer), come before the encoder holds the ring, or its cleanup be cut short."""
    gone, encoder = ProcessFlag(), shm_encoder(tmp_path)
    encoder.encode(np.zeros((8, 8, 3), np.uint8))  # the first frame makes the ring
    spec = TransportSpec(kind="shm", shm_dir=str(tmp_path))
    raise_parent_gone_on(
        signal.SIGUSR1,
        parent_pid=os.getppid(),
        stopping=lambda: True,
        on_gone=leave_when_gone(gone, [ring_path(encoder, spec)]),
    )
    with pytest.raises(ParentGone):
        signalled()
    assert gone.is_set()
    assert list(tmp_path.iterdir()) == []  # before any cleanup
    encoder.close()  # legal still


def test_a_decoder_told_to_go_as_its_ring_is_made_leaves_no_ring(
    restore_sigusr1, tmp_path: Path, monkeypatch
):
    """The signal lands once the ring is made and before the encoder holds it: the encoder's
    close has nothing to close, and the segment stayed, owned by nobody."""

    def made_then_signalled(*args: object, **kwargs: object) -> ShmRing:
        ring = ShmRing(*args, **kwargs)  # type: ignore[arg-type]
        signalled()  # ParentGone from here: the ring never reaches the encoder
        return ring

    monkeypatch.setattr(transport, "ShmRing", made_then_signalled)
    gone, encoder = ProcessFlag(), shm_encoder(tmp_path)
    spec = TransportSpec(kind="shm", shm_dir=str(tmp_path))
    raise_parent_gone_on(
        signal.SIGUSR1,
        parent_pid=os.getppid(),
        stopping=lambda: True,
        on_gone=leave_when_gone(gone, [ring_path(encoder, spec)]),
    )
    with pytest.raises(ParentGone):
        try:
            encoder.encode(np.zeros((8, 8, 3), np.uint8))
        finally:
            encoder.close()  # the decoder's cleanup
    assert list(tmp_path.iterdir()) == []


#: a process whose parent is SIGKILLed: says when it sees it gone (its parent is the argument)
_ORPHAN = """
import sys, time
from streams.lifeline import parent_alive
parent = int(sys.argv[1])
print("ready" if parent_alive(parent) else "not its parent", flush=True)
deadline = time.monotonic() + 30
while parent_alive(parent) and time.monotonic() < deadline:
    time.sleep(0.01)
print("alive" if parent_alive(parent) else "gone", flush=True)
"""
#: its parent: starts it, then waits to be killed
_PARENT = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
time.sleep(60)
"""


def test_a_parent_sigkilled_is_seen_gone_in_the_parent_pid():
    """No signal handled: a decode process whose daemon was SIGKILLed knows at once."""
    assert parent_alive(os.getppid())
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _ORPHAN],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert parent.stdout.readline().strip() == "ready"
        parent.kill()
        parent.wait()
        assert parent.stdout.readline().strip() == "gone"
    finally:
        parent.kill()
        parent.stdout.close()
