"""Events to an HTTP endpoint: each batch POSTed as ``{"events": [...]}`` (each event as
``ObjectEvent.to_json`` writes it), signed with HMAC-SHA256 when a secret is set.

Headers: ``Content-Type: application/json``, ``X-Framebatch-Event-Ids`` (the batch's ids,
comma-separated, for de-duplication before parsing) and, with a secret,
``X-Framebatch-Signature: sha256=<hex HMAC-SHA256 of the body>``.

A 2xx delivers the batch.  400, 410 and 422 are the receiver refusing this batch's content:
``OutputRejected`` (counted dropped, cause ``rejected``).  413 (too large) splits the batch in
halves, each sent whatever became of the other, down to single events (one event refused as
too large is rejected; the relay counts only the events refused).  Any other answer
(408, 429, 5xx, 401/403 after a rotated token, 404 while a receiver is redeployed, a redirect:
POSTs are never redirected), a timeout or a refused connection is the receiver away: tried
``retries`` more times with exponential backoff (``Retry-After`` honoured, up to
``backoff_max_s``), then ``OutputUnavailable`` (the relay tries again later, the events wait).
The ids header is left out of a batch whose ids would pass 4 KB (proxies cap headers at 8 KB).
Uses the standard library's HTTP client (httpx is no core dependency).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from time import time
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_core import PydanticCustomError

from streams.object_events import ObjectEvent
from streams.outputs.base import (
    OutputError,
    OutputOptions,
    OutputRejected,
    OutputUnavailable,
    backoff_delay,
)
from streams.urls import redact_url

SIGNATURE_HEADER = "X-Framebatch-Signature"
EVENT_IDS_HEADER = "X-Framebatch-Event-Ids"
#: the receiver refuses this batch's content: sending it again cannot help
REJECTED_STATUSES = frozenset({400, 410, 422})
TOO_LARGE = 413
MAX_IDS_HEADER = 4096


class Options(OutputOptions):
    kind: Literal["webhook"] = "webhook"
    url: str = Field(repr=False, description="http:// or https:// URL each batch is POSTed to")
    secret: SecretStr | None = Field(
        None,
        description="HMAC-SHA256 key of X-Framebatch-Signature (write ${VAR} to take it from "
        "the environment); unset: no signature unless secret_env is set",
    )
    secret_env: str | None = Field(
        None, description="Name of an environment variable holding the secret, read at start"
    )
    headers: dict[str, str] = Field(
        default_factory=dict, repr=False, description="More request headers (Authorization...)"
    )
    timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        allow_inf_nan=False,
        description="Per request, connecting to the whole answer read (the connection is cut then)",
    )
    retries: int = Field(
        3, ge=0, le=20, description="Tries after a failed one before the relay's longer wait"
    )
    backoff_base_s: float = Field(
        0.5, gt=0, le=60, allow_inf_nan=False, description="First wait between tries"
    )
    backoff_max_s: float = Field(
        10.0, gt=0, le=300, allow_inf_nan=False, description="Longest wait between tries"
    )

    def longest_delivery_s(self) -> float:
        return (self.retries + 1) * self.timeout_s + self.retries * self.backoff_max_s

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PydanticCustomError("config", "must be an http:// or https:// URL with a host")
        return url


def sign(body: bytes, secret: bytes) -> str:
    """The ``X-Framebatch-Signature`` value of ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(body: bytes, secret: bytes, signature: str) -> bool:
    """What a receiver does (constant-time comparison)."""
    return hmac.compare_digest(sign(body, secret), signature)


def batch_body(events: Sequence[ObjectEvent]) -> bytes:
    return json.dumps({"events": [e.to_json() for e in events]}, separators=(",", ":")).encode()


def is_retryable(status: int) -> bool:
    """The receiver is away or not ready (try again), as opposed to refusing the batch."""
    return status not in REJECTED_STATUSES and status != TOO_LARGE


def retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time() if now is None else now))


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would follow a 301/302/303 to a POST with a GET without the body, and take the
    GET's 200 for a delivery: every redirect is an answer of its own here."""

    def redirect_request(self, *args, **kwargs):
        return None


class _Deadline:
    """Shuts a request's connection down once ``seconds`` have passed.  urllib's ``timeout``
    bounds each socket call, not the request: a receiver that trickled its answer a byte at a
    time held the output as long as it liked, and ``longest_delivery_s`` (which the relay's
    ``claim_idle_s`` is checked against) bounded nothing."""

    def __init__(self, seconds: float):
        self._seconds = seconds
        self._socket: socket.socket | None = None
        self._done = threading.Event()
        self.expired = False

    def watch(self, connected: socket.socket) -> None:
        self._socket = connected

    def __enter__(self) -> _Deadline:
        threading.Thread(target=self._cut_when_due, name="webhook-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()

    def _cut_when_due(self) -> None:
        if self._done.wait(self._seconds):
            return
        self.expired = True
        while not self._done.is_set():
            if self._socket is not None:
                try:
                    self._socket.shutdown(socket.SHUT_RDWR)  # wakes the read blocked on it
                except OSError:  # closed meanwhile: the request is over
                    pass
                return
            self._done.wait(0.05)  # still connecting: its own timeout bounds that


class _Watched(urllib.request.AbstractHTTPHandler):
    """Shows each request's socket, once connected, to the request's :class:`_Deadline` (urllib
    takes it from the connection once the answer's headers are in: the answer reads on)."""

    def do_open(self, http_class, req, **http_conn_args):  # type: ignore[no-untyped-def]
        deadline: _Deadline | None = getattr(req, "deadline", None)

        def connection(host: str, **options: object) -> http.client.HTTPConnection:
            made = http_class(host, **options)
            if deadline is not None:
                connect = made.connect

                def connect_watched() -> None:
                    connect()
                    deadline.watch(made.sock)

                made.connect = connect_watched  # type: ignore[method-assign]
            return made

        return super().do_open(connection, req, **http_conn_args)


class _WatchedHTTP(_Watched, urllib.request.HTTPHandler):
    pass


class _WatchedHTTPS(_Watched, urllib.request.HTTPSHandler):
    pass


class WebhookOutput:
    def __init__(self, options: Options, *, secret: bytes | None):
        self.name = options.output_name
        self._options = options
        self._secret = secret
        self._where = redact_url(options.url)
        self._closed = threading.Event()
        self._opener = urllib.request.build_opener(_NoRedirects(), _WatchedHTTP(), _WatchedHTTPS())

    def deliver(self, events: Sequence[ObjectEvent]) -> None:
        refused, reason = self._deliver_in_parts(events)
        if refused:
            raise OutputRejected(f"{reason} ({refused} of {len(events)} events)", refused=refused)

    def _deliver_in_parts(self, events: Sequence[ObjectEvent]) -> tuple[int, str]:
        """How many of ``events`` the receiver refused, and why.  A 413 splits them in halves,
        each sent whatever became of the other, down to single events."""
        if not events:
            return 0, ""
        try:
            self._deliver(events)
        except _TooLarge as exc:
            if len(events) == 1:
                return 1, str(exc)
            half = len(events) // 2
            first, first_reason = self._deliver_in_parts(events[:half])
            second, second_reason = self._deliver_in_parts(events[half:])
            return first + second, second_reason or first_reason
        except OutputRejected as exc:
            return len(events), str(exc)
        return 0, ""

    def _deliver(self, events: Sequence[ObjectEvent]) -> None:
        body = batch_body(events)
        headers = {
            **self._options.headers,
            "Content-Type": "application/json",
            "User-Agent": "framebatch",
        }
        ids = ",".join(event.id for event in events)
        if len(ids) <= MAX_IDS_HEADER:
            headers[EVENT_IDS_HEADER] = ids
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(body, self._secret)
        attempt = 0
        while True:
            if self._closed.is_set():
                raise OutputUnavailable(f"webhook {self.name!r} closed")
            wait_s, problem = self._post(body, headers)
            if wait_s is None:
                return
            attempt += 1
            if attempt > self._options.retries:
                raise OutputUnavailable(problem)
            delay = backoff_delay(
                attempt, base_s=self._options.backoff_base_s, max_s=self._options.backoff_max_s
            )
            if self._closed.wait(min(max(delay, wait_s), self._options.backoff_max_s)):
                raise OutputUnavailable(f"webhook {self.name!r} closed")

    def _post(self, body: bytes, headers: Mapping[str, str]) -> tuple[float | None, str]:
        """(None, "") once delivered; (seconds the receiver asked to wait, the problem) when
        it is away; raises ``OutputRejected`` when it refuses."""
        request = urllib.request.Request(
            self._options.url, data=body, headers=dict(headers), method="POST"
        )
        deadline = _Deadline(self._options.timeout_s)
        request.deadline = deadline  # type: ignore[attr-defined]
        try:
            with deadline, self._opener.open(request, timeout=self._options.timeout_s) as response:
                status = response.status
                try:  # the rest of the answer, as a polite client does: its status decides
                    response.read()
                except (OSError, http.client.HTTPException):  # cut at the deadline: too late
                    pass  # to take back a delivery the receiver has acknowledged
        except urllib.error.HTTPError as exc:
            status = exc.code
            reason = f"webhook {self._where} answered HTTP {status}"
            exc.close()
            if status == TOO_LARGE:
                raise _TooLarge(reason) from None
            if is_retryable(status):
                return retry_after_s(exc.headers.get("Retry-After")) or 0.0, reason
            raise OutputRejected(reason) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            if deadline.expired:
                return (
                    0.0,
                    f"webhook {self._where}: no whole answer in {self._options.timeout_s:g} s",
                )
            cause = getattr(exc, "reason", exc)
            return 0.0, redact_url(f"webhook {self._where} unreachable: {cause}")
        if 200 <= status < 300:
            return None, ""
        return 0.0, f"webhook {self._where} answered HTTP {status}"  # 1xx/3xx: not delivered

    def close(self) -> None:
        self._closed.set()


class _TooLarge(Exception):
    """413: the batch is to be sent in smaller parts."""


def secret_of(options: Options, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The signing key: ``secret``, else the variable ``secret_env`` names (unset: bad input)."""
    if options.secret is not None:
        return options.secret.get_secret_value().encode()
    if options.secret_env is None:
        return None
    value = (os.environ if environ is None else environ).get(options.secret_env)
    if not value:
        raise OutputError(
            f"webhook output {options.output_name!r}: environment variable "
            f"{options.secret_env!r} (secret_env) is not set"
        )
    return value.encode()


def open_output(options: Options) -> WebhookOutput:
    """Nothing is sent at start: a receiver away is an outage the relay waits out."""
    return WebhookOutput(options, secret=secret_of(options))
