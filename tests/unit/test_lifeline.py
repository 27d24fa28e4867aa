"""A child that learns its parent is gone even when the exception saying so is dropped."""

from __future__ import annotations

import gc
import os
import signal
import threading

import pytest

from streams.decode_worker import AnyOf, ProcessFlag
from streams.lifeline import ParentGone, raise_parent_gone_on


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


def test_a_signal_meant_for_the_whole_group_is_ignored(restore_sigusr1):
    gone = ProcessFlag()  # lock-free, as the decoder's
    raise_parent_gone_on(
        signal.SIGUSR1, parent_pid=os.getppid(), stopping=lambda: False, on_gone=gone.set
    )
    os.kill(os.getpid(), signal.SIGUSR1)
    for _ in range(1000):
        pass
    assert not gone.is_set()


@pytest.mark.parametrize(
    ("first", "second", "expected"), [(0, 0, False), (1, 0, True), (0, 1, True)]
)
def test_any_of_is_set_when_one_of_its_signals_is(first, second, expected):
    signals = [threading.Event(), threading.Event()]
    for event, on in zip(signals, (first, second), strict=True):
        if on:
            event.set()
    either = AnyOf(*signals, None)
    assert either.is_set() is expected
    assert either.wait(0.05) is expected
