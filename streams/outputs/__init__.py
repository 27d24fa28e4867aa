"""Where analytics events go after Redis: one module per output, behind the ``EventOutput``
port (:mod:`.base`), fed by the relay (:mod:`.relay`).

Adding an output is one new module here, named as its ``kind``, that defines ``Options`` (an
:class:`~streams.outputs.base.OutputOptions` whose ``kind`` is ``Literal["<module name>"]``) and
``open_output(options) -> EventOutput``.  The config's ``outputs:`` entries are validated
against every module's ``Options``; nothing else needs to change.
"""

from __future__ import annotations

import functools
from types import ModuleType

from streams.outputs.base import (
    EventOutput,
    OutputError,
    OutputOptions,
    OutputRejected,
    OutputUnavailable,
)
from streams.registry import kind_modules

_NOT_OUTPUTS = frozenset({"base", "relay"})


@functools.cache
def output_modules() -> dict[str, ModuleType]:
    """Every output module of this package, by kind."""
    return kind_modules(__name__, __path__, skip=_NOT_OUTPUTS, field="kind", entry="open_output")


def output_options_models() -> tuple[type[OutputOptions], ...]:
    return tuple(module.Options for module in output_modules().values())


def open_output(options: OutputOptions) -> EventOutput:
    """The output ``options`` configure, connected (``OutputError``: bad input at start)."""
    return output_modules()[options.kind].open_output(options)


__all__ = [
    "EventOutput",
    "OutputError",
    "OutputOptions",
    "OutputRejected",
    "OutputUnavailable",
    "open_output",
    "output_modules",
    "output_options_models",
]
