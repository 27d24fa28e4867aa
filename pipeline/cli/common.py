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
    itself sets too). Second: ``on_exit_now()``, then exit now."""
    received = 0

    def handle(signum: int, _frame: object) -> None:
        nonlocal received
        received += 1
        if received > 1:
            on_exit_now()
            os._exit(128 + signum)
        log.warning(
            "%s received: finishing the batch in flight (again to exit now)",
            signal.Signals(signum).name,
        )
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def print_event(event: dict[str, str]) -> None:
    """A decoder status event as a log line."""
    name = event.get("event", "")
    line = f"camera {event.get('camera')}: {name} {event.get('message', '')}".rstrip()
    if name in ("error", "crashed"):
        log.error("%s", line)
    else:
        log.info("%s", line)
