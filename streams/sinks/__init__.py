"""Where detections go: one module per sink, behind the ``DetectionSink`` port (:mod:`.base`).

Adding a sink is one new module here, named as its ``kind``, that defines ``Options`` (a
:class:`~streams.sinks.base.SinkOptions` whose ``kind`` is ``Literal["<module name>"]``) and
``open_sink(options, context) -> DetectionSink``.  The config's ``sinks:`` entries are validated
against every module's ``Options``; nothing else needs to change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

from streams.messages import DetectionMessage
from streams.registry import kind_modules
from streams.sinks.base import DetectionSink, SinkContext, SinkOptions

_NOT_SINKS = frozenset({"base"})
DEFAULT_SINK = "redis_streams"


@functools.cache
def sink_modules() -> dict[str, ModuleType]:
    """Every sink module of this package, by kind."""
    return kind_modules(__name__, __path__, skip=_NOT_SINKS, field="kind", entry="open_sink")


def sink_options_models() -> tuple[type[SinkOptions], ...]:
    return tuple(module.Options for module in sink_modules().values())


def default_sinks() -> list[SinkOptions]:
    return [sink_modules()[DEFAULT_SINK].Options()]


class SinkGroup:
    """The configured sinks, written in config order; the batch counts as written once every
    one of them has returned."""

    name = "sinks"

    def __init__(self, sinks: Sequence[DetectionSink]):
        self.sinks = tuple(sinks)

    def write(self, messages: Sequence[DetectionMessage]) -> None:
        for sink in self.sinks:
            sink.write(messages)

    def close(self) -> None:
        for sink in reversed(self.sinks):
            sink.close()


def open_sinks(options: Sequence[SinkOptions], context: SinkContext) -> SinkGroup:
    """Open each configured sink (closing those opened already if one fails)."""
    opened: list[DetectionSink] = []
    try:
        for entry in options:
            opened.append(sink_modules()[entry.kind].open_sink(entry, context))
    except BaseException:
        SinkGroup(opened).close()
        raise
    return SinkGroup(opened)


__all__ = [
    "DetectionSink",
    "SinkContext",
    "SinkGroup",
    "SinkOptions",
    "default_sinks",
    "open_sinks",
    "sink_options_models",
]
