"""Events to NATS JetStream (nats-py): each event a message on
``<subject_prefix>.events.<camera>.<kind>``, its JSON as ``ObjectEvent.to_json`` writes it.

``deliver`` publishes a batch at once and returns when JetStream acknowledged every message
(stored in its stream).  Each message carries the event's id as ``Nats-Msg-Id``, so JetStream
itself drops a repeat within the stream's duplicate window (a batch delivered again after a
broker restart, a relay killed before its acknowledgement): consumers see each event once; a
repeat later than the window (a relay that was gone longer) is told by the id in the payload.

The stream: the one that captures the subjects if there is one, else, with ``create_stream``
(the default), a stream of that name on ``<subject_prefix>.>``, file storage, the duplicate window
of the options.  At start, a server that refuses the user name or password, or a missing stream
that may not be created, is bad input (``OutputError``, one line, the password never shown); a
server merely down is an outage, connected to in the background (nats-py reconnects for ever).

nats-py is asyncio: the output runs its own event loop on a thread of its own, and the relay's
thread waits on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from streams.object_events import ObjectEvent
from streams.outputs.base import (
    OutputError,
    OutputOptions,
    OutputRejected,
    OutputUnavailable,
    ca_file_error,
    checked_url,
)
from streams.urls import redact_url

log = logging.getLogger(__name__)

DEFAULT_PORT = 4222
MSG_ID_HEADER = "Nats-Msg-Id"
_SUBJECT_UNSAFE = str.maketrans({".": "_", "*": "_", ">": "_", " ": "_", "\t": "_", "\0": "_"})


class Options(OutputOptions):
    kind: Literal["nats"] = "nats"
    url: str = Field(
        repr=False,
        description="nats://[user:password@]host[:4222] or tls://... (TLS); write ${VAR} for "
        "the password",
    )
    ca_file: str | None = Field(
        None, description="tls: CA certificates (PEM) the server's is checked against"
    )
    subject_prefix: str = Field("framebatch", description="First tokens of every subject")
    stream: str = Field("FRAMEBATCH", description="The JetStream stream created when none is")
    create_stream: bool = Field(
        True, description="Create the stream when no stream captures the subjects"
    )
    duplicate_window_s: float = Field(
        600.0,
        ge=1,
        le=86400,
        allow_inf_nan=False,
        description="Of a stream this output creates: how long JetStream drops a repeated event id",
    )
    publish_timeout_s: float = Field(
        10.0, gt=0, le=300, allow_inf_nan=False, description="Wait for a batch's acks"
    )
    connect_timeout_s: float = Field(
        5.0, gt=0, le=120, allow_inf_nan=False, description="Wait for the first connection"
    )
    reconnect_wait_s: float = Field(
        2.0, gt=0, le=60, allow_inf_nan=False, description="Wait between reconnection tries"
    )

    def longest_delivery_s(self) -> float:
        return self.publish_timeout_s + 1.0  # the acks' wait, and the hop to the loop

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        return checked_url(url, parse_url, "nats://[user:password@]host[:port] or tls://...")

    @field_validator("subject_prefix")
    @classmethod
    def _check_prefix(cls, prefix: str) -> str:
        tokens = prefix.split(".")
        if not all(tokens) or any(t != t.translate(_SUBJECT_UNSAFE) for t in tokens):
            raise PydanticCustomError(
                "config", "must be subject tokens joined by '.', without '*', '>' or spaces"
            )
        return prefix

    @field_validator("stream")
    @classmethod
    def _check_stream(cls, stream: str) -> str:
        if not stream or stream != stream.translate(_SUBJECT_UNSAFE) or "/" in stream:
            raise PydanticCustomError(
                "config", "must be a stream name without '.', '*', '>', '/' or spaces"
            )
        return stream


@dataclass(frozen=True)
class ServerAddress:
    server: str  # nats://host:port, without the user info
    tls: bool
    username: str | None
    password: str | None


def parse_url(url: str) -> ServerAddress:
    parts = urlsplit(url)
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        raise ValueError("not a nats:// or tls:// URL with a host")
    port = parts.port or DEFAULT_PORT  # ValueError: port out of range
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return ServerAddress(
        server=f"{parts.scheme}://{host}:{port}",
        tls=parts.scheme == "tls",
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def event_subject(prefix: str, event: ObjectEvent) -> str:
    return f"{prefix}.events.{event.camera.translate(_SUBJECT_UNSAFE)}.{event.kind}"


class NatsOutput:
    def __init__(self, options: Options):
        self.name = options.output_name
        self._options = options
        self._where = redact_url(options.url)
        self._address = parse_url(options.url)
        self._tls = None
        if self._address.tls:
            try:
                self._tls = ssl.create_default_context(cafile=options.ca_file)
            except OSError as exc:
                raise ca_file_error("nats", self.name, options.ca_file, exc) from None
        self._lock = threading.Lock()
        self._first_outcome = threading.Event()  # connected, or the first error
        self._first_error: BaseException | None = None
        self._problem = "not connected yet"
        self._back: Callable[[], None] = lambda: None
        self._stream_ready = False
        self._closed = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"nats-{self.name}", daemon=True
        )
        self._thread.start()
        import nats  # the one module that needs it

        self._client = nats.NATS()
        self._js = self._client.jetstream(timeout=options.publish_timeout_s)
        self._connecting = self._submit(self._connect())

    # --- the output's event loop ------------------------------------------------------------
    def _submit(self, coroutine: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _connect(self) -> None:
        address, options = self._address, self._options
        try:
            await self._client.connect(
                servers=[address.server],
                user=address.username,
                password=address.password,
                tls=self._tls,
                tls_hostname=urlsplit(address.server).hostname if self._tls else None,
                name=f"framebatch-{self.name}",
                connect_timeout=options.connect_timeout_s,
                reconnect_time_wait=options.reconnect_wait_s,
                max_reconnect_attempts=-1,  # for ever: the events wait in Redis meanwhile
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        except Exception as exc:  # noqa: BLE001 (closed while connecting: told to deliver)
            self._note_problem(f"NATS server {self._where}: {_reason(exc)}")
            return
        with self._lock:
            self._problem = ""
        self._first_outcome.set()
        self._back()  # a server that came up only after the start: the relay may be waiting

    async def _on_error(self, exc: Exception) -> None:
        with self._lock:
            first = self._problem != f"NATS server {self._where}: {_reason(exc)}"
            self._problem = f"NATS server {self._where}: {_reason(exc)}"
            if self._first_error is None and not self._first_outcome.is_set():
                self._first_error = exc
        self._first_outcome.set()
        if first and not self._closed.is_set():
            log.warning("nats output %r: %s (retrying)", self.name, self._problem)

    async def _on_disconnected(self) -> None:
        with self._lock:
            self._problem = self._problem or f"NATS server {self._where} disconnected"

    async def _on_reconnected(self) -> None:
        with self._lock:
            self._problem = ""
        log.info("nats output %r reconnected to %s", self.name, self._where)
        self._back()

    def on_back(self, callback: Callable[[], None]) -> None:
        self._back = callback

    def _note_problem(self, problem: str) -> None:
        with self._lock:
            self._problem = problem
        self._first_outcome.set()

    async def _ensure_stream(self) -> None:
        """The stream that captures the subjects, created when none does (and allowed)."""
        from nats.js.api import StorageType, StreamConfig
        from nats.js.errors import NotFoundError

        options = self._options
        subjects = f"{options.subject_prefix}.>"
        try:
            await self._js.find_stream_name_by_subject(f"{options.subject_prefix}.events.x.y")
        except NotFoundError:
            if not options.create_stream:
                raise OutputError(
                    f"nats output {self.name!r}: no JetStream stream on {self._where} captures "
                    f"{subjects} and create_stream is false"
                ) from None
            config = StreamConfig(
                name=options.stream,
                subjects=[subjects],
                storage=StorageType.FILE,
                duplicate_window=options.duplicate_window_s,
            )
            await self._js.add_stream(config)
            log.info("nats output %r: created stream %s on %s", self.name, options.stream, subjects)
        self._stream_ready = True

    async def _publish(self, events: Sequence[ObjectEvent]) -> None:
        if not self._stream_ready:
            await self._ensure_stream()
        prefix = self._options.subject_prefix
        acks = [
            self._js.publish(
                event_subject(prefix, event),
                json.dumps(event.to_json(), separators=(",", ":")).encode(),
                headers={MSG_ID_HEADER: event.id},
            )
            for event in events
        ]
        await asyncio.wait_for(asyncio.gather(*acks), self._options.publish_timeout_s)

    # --- the relay's thread -----------------------------------------------------------------
    def wait_first_connect(self) -> None:
        """Bad input at start: a refused user name or password, or no stream to write to."""
        from nats.errors import AuthorizationError

        self._first_outcome.wait(self._options.connect_timeout_s)
        with self._lock:
            error, problem = self._first_error, self._problem
        if isinstance(error, AuthorizationError) or "authorization" in _reason(error).lower():
            self.close()
            raise OutputError(
                f"nats output {self.name!r}: the server at {self._where} refused the user "
                f"name or password ({_reason(error)})"
            )
        if not problem:
            try:
                self._submit(self._ensure_stream()).result(self._options.publish_timeout_s)
            except OutputError:
                self.close()
                raise
            except Exception as exc:  # noqa: BLE001 (a server going away: tried again later)
                problem = f"NATS server {self._where}: {_reason(exc)}"
            else:
                return
        log.warning("nats output %r: %s; retrying in the background", self.name, problem)

    def deliver(self, events: Sequence[ObjectEvent]) -> None:
        from nats.errors import MaxPayloadError

        if self._closed.is_set():
            raise OutputUnavailable(f"nats output {self.name!r} closed")
        if not self._client.is_connected:
            with self._lock:
                raise OutputUnavailable(self._problem or f"NATS server {self._where} away")
        future = self._submit(self._publish(events))
        try:
            future.result(self._options.longest_delivery_s())
        except MaxPayloadError as exc:  # an event larger than the server takes: never will
            raise OutputRejected(f"NATS server {self._where}: {_reason(exc)}") from None
        except OutputError as exc:  # the stream gone and not to be created again
            raise OutputUnavailable(str(exc)) from None
        except (TimeoutError, FutureTimeout):
            future.cancel()
            raise OutputUnavailable(
                f"NATS server {self._where}: no JetStream ack within "
                f"{self._options.publish_timeout_s:g} s"
            ) from None
        except Exception as exc:  # noqa: BLE001 (nats-py's errors: the server away, no stream)
            self._stream_ready = False  # a server restarted empty: find or make it again
            raise OutputUnavailable(f"NATS server {self._where}: {_reason(exc)}") from None

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._connecting.cancel()
        try:
            self._submit(self._client.close()).result(5)
        except Exception:  # noqa: BLE001 (closing what never connected)
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = str(exc).strip() or type(exc).__name__
    return redact_url(text.splitlines()[0])[:200]


def open_output(options: Options) -> NatsOutput:
    output = NatsOutput(options)
    output.wait_first_connect()
    return output
