"""What can end a framebatch command, each with its exit code.

The lower layers (``streams/``, ``detectors/``) raise their own exceptions; the composition
root turns them into one of these at the boundary where it knows which they are: before the
run starts, a bad URL or model file is the user's input (exit 2); once it runs, Redis away past
``redis.reconnect_timeout_s`` or a dead stage is a failed run (exit 3).  The command line prints
``str(error)`` as one line and exits with ``error.exit_code``.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CAMERA_ERRORS = 1  # the run finished, but a camera failed (the others were processed)
EXIT_BAD_INPUT = 2  # only at start: config, model file, Redis URL / password / ACL / TLS
EXIT_RUN_FAILED = 3  # the run broke off: Redis away past reconnect_timeout_s, a stage died
EXIT_TARGETS_MISSED = 4  # a benchmark ran, and a figure is under its target (bench-gpu)


class FramebatchError(Exception):
    """An error reported as one line and an exit code, never as a traceback."""

    exit_code = EXIT_RUN_FAILED


class BadInput(FramebatchError):
    """The config, a model file or the Redis URL / credentials / ACL / TLS, found at start."""

    exit_code = EXIT_BAD_INPUT


class RunFailed(FramebatchError):
    """The run broke off after it started; frames not yet published stay pending in Redis
    for the next run."""

    exit_code = EXIT_RUN_FAILED


class StageFailed(RunFailed):
    """A stage of a batch worker (reader, inferer, publisher, a sink) died."""


class RedisUnavailable(RunFailed):
    """Redis stayed away longer than ``redis.reconnect_timeout_s``."""
