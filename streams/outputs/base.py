"""The ``EventOutput`` port: where analytics events go once they are in Redis (an MQTT broker, a
webhook), and what the relay (:mod:`.relay`) needs to know of each.

``deliver`` returns only once the receiver acknowledged every event it was given (an MQTT
PUBACK at QoS 1, an HTTP 2xx); the relay acknowledges the events' stream entries after that.  A
crash in between delivers them again, never loses one: receivers de-duplicate by the event's
``id``.  ``deliver`` raises :class:`OutputUnavailable` when the receiver is away (the relay
retries the same events later) and :class:`OutputRejected` when it refuses them for good (the
relay counts them dropped, cause ``rejected``, and goes on).
"""

from __future__ import annotations

import random
import re
import ssl
from collections.abc import Callable, Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from streams.object_events import ObjectEvent

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class OutputOptions(BaseModel):
    """An output's settings in the config (``outputs:`` entries); ``kind`` names the output.
    What every output has: a name (its consumer group) and how the relay feeds it."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    kind: str
    name: str | None = Field(
        None,
        description="Unique among the outputs; its events are read through the consumer group "
        "output:<name> (default: the kind)",
    )
    batch_size: int = Field(50, ge=1, le=500, description="Most events per delivery")
    claim_idle_s: float = Field(
        120.0,
        ge=1,
        le=3600,
        allow_inf_nan=False,
        description="Events read by a process that stopped acknowledging for this long are "
        "taken over by another (a process that died before delivering them)",
    )
    retry_max_s: float = Field(
        30.0,
        ge=0.1,
        le=600,
        allow_inf_nan=False,
        description="Longest wait between tries while the receiver is away (exponential "
        "backoff with jitter up to this)",
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str | None) -> str | None:
        if name is not None and not _NAME.fullmatch(name):
            raise PydanticCustomError(
                "config",
                "invalid output name: use 1-64 letters, digits, '_', '.' or '-' "
                "(it becomes part of a Redis consumer group's name)",
            )
        return name

    @property
    def output_name(self) -> str:
        return self.name or self.kind

    def longest_delivery_s(self) -> float:
        """The longest one ``deliver`` call can take (its tries, timeouts and waits)."""
        return 0.0

    @model_validator(mode="after")
    def _check_claim_idle(self) -> OutputOptions:
        longest = self.longest_delivery_s()
        if self.claim_idle_s <= longest:
            raise PydanticCustomError(
                "config",
                f"claim_idle_s ({self.claim_idle_s:g}) must be longer than one delivery can "
                f"take ({longest:g} s with these tries and timeouts): else another process "
                "takes the events over while they are being delivered, and they are delivered "
                "twice",
            )
        return self


class EventOutput(Protocol):
    """Delivers analytics events to one receiver; used by one relay thread at a time, but
    ``close`` may come from another thread while ``deliver`` runs (it then raises
    ``OutputUnavailable`` promptly)."""

    name: str

    def deliver(self, events: Sequence[ObjectEvent]) -> None:
        """Returns once the receiver acknowledged every event; raises ``OutputUnavailable``
        (try again later) or ``OutputRejected`` (never will be accepted) otherwise."""

    def close(self) -> None:
        """Release the connection; legal in every state, more than once."""


class ReconnectingOutput(EventOutput, Protocol):
    """An output whose client reconnects by itself (MQTT, NATS) and so knows when its receiver
    is back: the relay then tries again at once rather than at the end of its backoff (up to
    ``retry_max_s``: events were held 5-25 s after a broker came back)."""

    def on_back(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) each time the connection is made again."""


class OutputError(Exception):
    """An output could not be opened: bad input at start (a refused password, a missing
    secret).  Messages never hold a password."""


class OutputUnavailable(Exception):
    """The receiver is away or did not acknowledge in time: the events are tried again."""


class OutputRejected(Exception):
    """The receiver refused the events (an HTTP 4xx other than 408/429): trying again would
    not change its answer, so they are counted dropped with cause ``rejected``.  ``refused``:
    how many of the events given (the others were delivered); ``None``: all of them."""

    def __init__(self, message: str, *, refused: int | None = None):
        super().__init__(message)
        self.refused = refused


def checked_url(url: str, parse: Callable[[str], object], expected: str) -> str:
    """``url`` where ``parse`` reads it, else the config error ``must be <expected>`` (which
    never repeats the URL: it may hold a password)."""
    try:
        parse(url)
    except ValueError:
        raise PydanticCustomError("config", f"must be {expected}") from None
    return url


def ca_file_error(kind: str, name: str, ca_file: str | None, exc: OSError) -> OutputError:
    """A ``ca_file`` that could not be loaded, named: missing or unreadable (``OSError``), or
    holding no certificate (``ssl.SSLError``)."""
    reason = str(exc) if isinstance(exc, ssl.SSLError) else exc.strerror or str(exc)
    return OutputError(f"{kind} output {name!r}: ca_file {ca_file!r}: {reason}")


def backoff_delay(
    attempt: int,
    *,
    base_s: float,
    max_s: float,
    rand: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to wait before try ``attempt + 1`` (``attempt`` >= 1 failures so far):
    exponential from ``base_s``, capped at ``max_s``, with "equal jitter" (between half the
    step and the step) so that many processes retrying a receiver that came back do not all
    knock at once."""
    step = min(max_s, base_s * 2 ** min(max(attempt - 1, 0), 32))
    return rand(step / 2, step)
