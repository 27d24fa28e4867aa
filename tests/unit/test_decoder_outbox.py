"""A decode process's outbox: the supervisor hands it jobs and stops without waiting on the
process's pipe (full while the process is still starting, or busy opening cameras), and the
process gets them all, in order."""

from __future__ import annotations

import multiprocessing
import threading

from pipeline.supervisor.decoder_processes import Outbox


def test_putting_never_waits_on_a_full_pipe_and_every_message_arrives_in_order():
    ours, theirs = multiprocessing.Pipe(duplex=True)
    outbox = Outbox(ours, "test-outbox")
    padding = "x" * 10_000  # 500 of these fill any pipe's buffer many times over

    def supervisor() -> None:
        for n in range(500):
            outbox.put(("start", n, padding))

    putting = threading.Thread(target=supervisor, daemon=True)
    putting.start()
    putting.join(60)  # a send on the full pipe, nothing reading it, would wait for ever
    assert not putting.is_alive()
    received = [theirs.recv()[1] for _ in range(500)]
    assert received == list(range(500))
    outbox.close()


def test_a_gone_process_ends_the_sending_quietly():
    ours, theirs = multiprocessing.Pipe(duplex=True)
    outbox = Outbox(ours, "test-outbox")
    theirs.close()  # the process died
    for n in range(100):
        outbox.put(("stop", f"cam{n}"))
    outbox.close()  # no error surfaces: the process is found dead on the next tick
