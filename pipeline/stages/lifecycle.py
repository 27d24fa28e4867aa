"""What the stages of one batch worker share: the stop request, the first failure, and the
hand-offs between them.

A stage that dies records its failure here; every hand-off then stops waiting, so the other
stages end instead of blocking on an item that cannot come, and ``raise_failure`` reports it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import redis

from pipeline.errors import StageFailed
from pipeline.telemetry import NO_TELEMETRY, Telemetry
from streams.redis_errors import is_outage
from streams.urls import redact_url

log = logging.getLogger(__name__)

T = TypeVar("T")
POLL_S = 0.1  # how soon a waiting stage notices a failure elsewhere
_END = object()  # closes a hand-off: no more items


class Lifecycle:
    """One run of a batch worker's stages."""

    def __init__(self, stop: threading.Event, telemetry: Telemetry = NO_TELEMETRY):
        self.stop = stop  # set from outside: stop reading, finish what is in flight
        self._telemetry = telemetry
        self._failure: tuple[str, BaseException] | None = None
        self._threads: list[threading.Thread] = []

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def fail(self, stage: str, error: BaseException) -> None:
        """Record a stage's death (the first one is reported)."""
        if self._failure is None:
            self._failure = (stage, error)  # first: the other stages stop waiting whatever follows
        # Redis away too long is said in one line by the command; anything else is a bug
        # whose traceback is wanted
        trace = None if is_redis_outage(error) else error
        log.error("batcher %s stage failed: %s", stage, _describe(error), exc_info=trace)
        self._telemetry.stage_failed(stage, error)

    def start(self, stage: str, body: Callable[[], None]) -> None:
        """Run ``body`` on a thread of its own; its exception fails the lifecycle."""

        def guarded() -> None:
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - recorded, raised by raise_failure
                self.fail(stage, exc)

        thread = threading.Thread(target=guarded, name=f"fb-{stage}")
        self._threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    def raise_failure(self) -> None:
        if self._failure is not None:
            stage, error = self._failure
            raise StageFailed(f"batcher {stage} stage failed: {_describe(error)}") from error

    def handoff(self) -> Handoff[T]:
        return Handoff(self)


def _describe(error: BaseException) -> str:
    return redact_url(f"{type(error).__name__}: {error}")


def is_redis_outage(error: BaseException) -> bool:
    """Redis unreachable, as opposed to any other timeout (a sink's disk, a backend)."""
    return isinstance(error, redis.RedisError) and is_outage(error)


class Handoff(Generic[T]):
    """One item between two stages (a queue of one, so a batch is prepared while the one before
    runs, and no more).  ``put`` waits while the next stage is busy and ``get`` while nothing
    came; both give up once the lifecycle failed.  ``close`` ends the work."""

    def __init__(self, lifecycle: Lifecycle):
        self._lifecycle = lifecycle
        self._queue: queue.Queue[object] = queue.Queue(maxsize=1)
        self._taken = threading.Event()

    @property
    def free(self) -> bool:
        """The next stage has taken what was put: it can take another at once."""
        return self._queue.empty()

    def put(self, item: T) -> None:
        self._put(item)

    def close(self) -> None:
        self._put(_END)

    def _put(self, item: object) -> None:
        while not self._lifecycle.failed:
            try:
                self._queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                pass

    def __iter__(self) -> Iterator[T]:
        """Items until closed, or until a stage failed.  Several threads may take from one
        hand-off (instances of the detector): each item goes to one of them, the end to all."""
        while not self._lifecycle.failed:
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if item is _END:
                self._queue.put(_END)  # for the next taker: nothing else can be put after it
                return
            self._taken.set()
            yield item  # type: ignore[misc]

    def wait_taken(self, timeout_s: float) -> None:
        """Sleep until the next stage takes an item (or ``timeout_s``)."""
        self._taken.wait(timeout_s)
        self._taken.clear()
