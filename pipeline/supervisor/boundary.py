"""The boundary of a run: whatever ends it becomes a ``FramebatchError`` with its exit code.

Before the detector workers start, what the lower layers raise for bad input (a URL, a
password, a model file, a sink's path) is ``BadInput`` (exit 2); once they run, a failure is
``RunFailed`` (exit 3); Redis unreachable past ``redis.reconnect_timeout_s`` is
``RedisUnavailable`` either way; anything else is a bug, shown as a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import redis

from detectors.base import BackendUnavailable
from pipeline.config import Config
from pipeline.errors import BadInput, FramebatchError, RedisUnavailable, RunFailed, StageFailed
from pipeline.stages.lifecycle import is_redis_outage
from streams.embedded_redis import RedisServerError
from streams.redis_access import RedisAccessError
from streams.redis_errors import is_outage
from streams.sinks.base import SinkError
from streams.urls import redact_url

#: What the lower layers raise for bad input found before the run starts (exit 2).
START_ERRORS = (
    FileNotFoundError,
    ValueError,
    RedisServerError,
    RedisAccessError,
    BackendUnavailable,
    SinkError,
)


@contextmanager
def composing(config: Config) -> Iterator[ExitStack]:
    """The exit stack a role's factory opens everything into: closed again if composing
    fails, with what failed (or failed while closing) as bad input or Redis gone."""
    with run_errors(config, started=False):
        stack = ExitStack()
        try:
            yield stack
        except BaseException:
            stack.close()
            raise


@contextmanager
def run_errors(config: Config, *, started: bool) -> Iterator[None]:
    """Errors of a run, as ``FramebatchError`` s; ``started``: the detector workers run."""
    try:
        yield
    except FramebatchError as exc:
        cause = exc.__cause__
        if isinstance(exc, StageFailed) and cause is not None and is_redis_outage(cause):
            raise redis_gone(config, cause) from cause
        raise
    except START_ERRORS as exc:
        if started:
            raise
        raise BadInput(redact_url(str(exc))) from exc
    except redis.RedisError as exc:
        if is_outage(exc):
            raise redis_gone(config, exc) from exc
        raise RunFailed(f"the run failed: {redact_url(str(exc))}") from exc


def redis_gone(config: Config, exc: BaseException) -> RedisUnavailable:
    where = redact_url(config.redis.url or "the private redis-server")
    timeout = config.redis.reconnect_timeout_s
    return RedisUnavailable(
        f"Redis at {where} unreachable for more than {timeout:.0f} s "
        f"(redis.reconnect_timeout_s): {redact_url(str(exc))}"
    )
