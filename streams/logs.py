"""One log format for every process of a run: the daemon's and the decode processes it starts.

Decode processes are spawned (``multiprocessing`` "spawn"): they start with Python's logging
unset, whose last-resort handler prints a bare message without time or level. Each process's
entry calls :func:`configure_process_logging` with the level its parent logs at.
"""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def configure_process_logging(level: int = logging.INFO) -> None:
    """Log to stderr in :data:`LOG_FORMAT` at ``level``; nothing changes where this process's
    logging is set up already (the entry run in-process, under a test runner)."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
