"""What the commands share: how an error is reported, and how a run stops on a signal."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from pipeline.errors import FramebatchError

log = logging.getLogger("framebatch")


def report(exc: FramebatchError) -> int:
    """One line (a config error: one per problem) on stderr; the error's exit code."""
    from pipeline.config import ConfigError

    print(exc if isinstance(exc, ConfigError) else f"framebatch: {exc}", file=sys.stderr)
    return exc.exit_code


def install_stop_handlers(
    stop: threading.Event, on_exit_now: Callable[[], None] = lambda: None
) -> None:
    """First SIGINT/SIGTERM: stop gracefully (the run's stop signal, which a run that ends by
    itself sets too). Second: ``on_exit_now()``, then exit now.

    Signals are counted on a thread of their own, from the bytes the interpreter's C-level
    handler writes to a wakeup pipe for each one: a Python handler runs on the main thread only
    between bytecodes, so two signals that come while it sits in a long C call (loading a model)
    would run it once, and the second would be lost."""
    readable, writable = os.pipe()
    os.set_blocking(writable, False)
    signal.set_wakeup_fd(writable, warn_on_full_buffer=False)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: None)  # the wakeup pipe does the work

    def count() -> None:
        received = 0
        while True:
            for signum in os.read(readable, 64):
                if signum not in (signal.SIGINT, signal.SIGTERM):
                    continue
                received += 1
                if received > 1:
                    on_exit_now()
                    os._exit(128 + signum)
                log.warning(
                    "%s received: stopping gracefully (again to exit now)",
                    signal.Signals(signum).name,
                )
                stop.set()

    threading.Thread(target=count, name="fb-signals", daemon=True).start()


def print_event(event: dict[str, str]) -> None:
    """A decoder status event as a log line."""
    name = event.get("event", "")
    line = f"camera {event.get('camera')}: {name} {event.get('message', '')}".rstrip()
    if name in ("error", "crashed"):
        log.error("%s", line)
    else:
        log.info("%s", line)
