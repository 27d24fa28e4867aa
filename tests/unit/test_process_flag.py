"""ProcessFlag: the decoders' stop signal, which a decoder killed while waiting cannot jam."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from streams.decode_worker import ProcessFlag


def test_set_wait_and_timeout() -> None:
    flag = ProcessFlag(poll_s=0.005)
    started = time.monotonic()
    assert flag.wait(0.05) is False and not flag.is_set()
    assert 0.04 <= time.monotonic() - started < 1.0
    flag.set()
    assert flag.is_set() and flag.wait(10) is True and flag.wait() is True


def _wait_for(flag: ProcessFlag, waiting) -> None:
    waiting.release()
    flag.wait()


def test_a_waiter_killed_mid_wait_does_not_block_set() -> None:
    """multiprocessing.Event.set() hangs forever here (its condition waits for the dead
    sleeper); the flag is set at once, and a live waiter still sees it."""
    context = multiprocessing.get_context("spawn")
    flag, waiting = ProcessFlag(), context.Semaphore(0)
    victim = context.Process(target=_wait_for, args=(flag, waiting))
    survivor = context.Process(target=_wait_for, args=(flag, waiting))
    victim.start()
    survivor.start()
    assert waiting.acquire(timeout=60) and waiting.acquire(timeout=60)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    started = time.monotonic()
    flag.set()
    assert time.monotonic() - started < 1.0
    survivor.join(10)
    assert survivor.exitcode == 0 and victim.exitcode == -signal.SIGKILL
