"""Events to an MQTT broker (paho-mqtt, MQTT 3.1.1, QoS 1).

Each event is published as JSON (``ObjectEvent.to_json``) to ``<topic_prefix>/events``; an event
with a running count (zone entries and exits, line crossings) also sets a retained count topic,
Frigate style: ``<topic_prefix>/<camera>/<zone or line>/<label>`` (a line crossing:
``.../<line>/<label>/<direction>``), whose payload is the count as plain text.

``deliver`` returns once the broker acknowledged (PUBACK) every message of the batch.  paho's
network thread reconnects with backoff (``reconnect_min_s`` up to ``reconnect_max_s``); while
it is away ``deliver`` raises ``OutputUnavailable`` at once and the relay waits.  At start, a
broker that refuses the user name or password is bad input (``OutputError``, one line, the
password never shown); a broker merely down is an outage, retried in the background.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from streams.object_events import ObjectEvent
from streams.outputs.base import (
    OutputError,
    OutputOptions,
    OutputUnavailable,
    ca_file_error,
    checked_url,
)
from streams.urls import redact_url

log = logging.getLogger(__name__)

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}
#: CONNACK reasons no reconnecting mends (MQTT 3.1.1's codes 4 and 5, as paho names them)
AUTH_REFUSALS = frozenset({"Bad user name or password", "Not authorized"})
_TOPIC_UNSAFE = str.maketrans({"/": "_", "+": "_", "#": "_", "\0": "_"})


class Options(OutputOptions):
    kind: Literal["mqtt"] = "mqtt"
    url: str = Field(
        repr=False,
        description="mqtt://[user:password@]host[:1883] or mqtts://... (TLS, port 8883); "
        "write ${VAR} for the password",
    )
    ca_file: str | None = Field(
        None,
        description="mqtts: CA certificates (PEM) the broker's is checked against "
        "(default: the system's)",
    )
    topic_prefix: str = Field("framebatch", description="First level of every topic")
    client_id: str | None = Field(
        None, description="MQTT client id (default: framebatch-<name>-<pid>-<random>)"
    )
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive")
    publish_timeout_s: float = Field(
        10.0, gt=0, le=300, allow_inf_nan=False, description="Wait for a batch's PUBACKs"
    )
    connect_timeout_s: float = Field(
        5.0, gt=0, le=120, allow_inf_nan=False, description="Wait for the first connection"
    )
    reconnect_min_s: int = Field(1, ge=1, le=60, description="First wait before reconnecting")
    reconnect_max_s: int = Field(30, ge=1, le=600, description="Longest wait between tries")

    def longest_delivery_s(self) -> float:
        return self.publish_timeout_s

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        return checked_url(url, parse_url, "mqtt://[user:password@]host[:port] or mqtts://...")

    @field_validator("topic_prefix")
    @classmethod
    def _check_prefix(cls, prefix: str) -> str:
        if not prefix or any(c in prefix for c in "+#\0") or prefix.startswith("/"):
            raise PydanticCustomError(
                "config", "must be a non-empty topic without '+', '#' or a leading '/'"
            )
        return prefix.rstrip("/")


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None


def parse_url(url: str) -> BrokerAddress:
    """``mqtt://user:pass@host:1883`` -> its parts (user and password percent-decoded)."""
    parts = urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError("not an mqtt:// or mqtts:// URL with a host")
    port = parts.port or DEFAULT_PORTS[parts.scheme]  # ValueError: port out of range
    return BrokerAddress(
        host=parts.hostname,
        port=port,
        tls=parts.scheme == "mqtts",
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def events_topic(prefix: str) -> str:
    return f"{prefix}/events"


def count_topic(prefix: str, event: ObjectEvent) -> str | None:
    """The retained topic the event's running count goes to; None when it has none."""
    if event.count is None or not event.region:
        return None
    levels = [prefix, event.camera, event.region, event.label]
    if event.kind == "line_cross":
        levels.append(event.direction)
    return "/".join([prefix] + [level.translate(_TOPIC_UNSAFE) for level in levels[1:]])


class MqttOutput:
    def __init__(self, options: Options):
        import paho.mqtt.client as mqtt  # the one module that needs it

        self.name = options.output_name
        self._options = options
        self._where = redact_url(options.url)
        self._prefix = options.topic_prefix
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._attempted = threading.Event()  # the first connection attempt has an outcome
        self._refused: str | None = None  # the broker's last refusal of our connection
        self._problem = "not connected yet"
        self._back: Callable[[], None] = lambda: None
        # count topic -> (time, seq, index) of the event whose count it shows: an older event (one
        # taken over from a process that died) must not put an older count back
        self._counts: dict[str, tuple[float, int, int]] = {}
        address = self._address = parse_url(options.url)
        client_id = options.client_id or (
            f"framebatch-{self.name}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self._client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        if address.username is not None:
            self._client.username_pw_set(address.username, address.password)
        if address.tls:
            try:
                self._client.tls_set(ca_certs=options.ca_file)
            except OSError as exc:
                raise ca_file_error("mqtt", self.name, options.ca_file, exc) from None
        self._client.reconnect_delay_set(options.reconnect_min_s, options.reconnect_max_s)
        self._client.max_queued_messages_set(4 * 2 * options.batch_size)
        self._client.on_connect = self._on_connect
        self._client.on_connect_fail = self._on_connect_fail
        self._client.on_disconnect = self._on_disconnect
        self._client.connect_async(address.host, address.port, keepalive=options.keepalive_s)
        self._client.loop_start()  # paho's thread: connects, reconnects with backoff

    # --- paho's thread --------------------------------------------------------------------
    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any):
        if reason.is_failure:
            name = reason.getName()
            with self._lock:
                first = self._refused != name
                self._refused = name
                self._problem = f"MQTT broker {self._where} refused the connection: {name}"
            if first and self._attempted.is_set():
                log.warning("%s (retrying)", self._problem)
        else:
            with self._lock:
                if self._refused is not None or self._problem != "not connected yet":
                    log.info("MQTT output %r connected to %s", self.name, self._where)
                self._refused = None
                self._problem = ""
            self._back()
        self._attempted.set()

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        with self._lock:
            self._problem = f"MQTT broker {self._where} unreachable"
        self._attempted.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any):
        with self._lock:
            if not self._problem:
                self._problem = f"MQTT broker {self._where} disconnected: {reason}"
                if not self._closed.is_set():
                    log.warning("%s (reconnecting)", self._problem)

    # --- the relay's thread ---------------------------------------------------------------
    def on_back(self, callback: Callable[[], None]) -> None:
        self._back = callback

    def wait_first_connect(self) -> None:
        """Bad input at start: the broker refuses the user name or password."""
        self._attempted.wait(self._options.connect_timeout_s)
        with self._lock:
            refused, problem = self._refused, self._problem
        if refused in AUTH_REFUSALS:
            self.close()
            raise OutputError(
                f"mqtt output {self.name!r}: the broker at {self._where} refused the user name "
                f"or password ({refused})"
            )
        if problem and self._address.tls and (untrusted := self._untrusted_certificate()):
            self.close()
            raise OutputError(
                f"mqtt output {self.name!r}: the broker at {self._where} has a TLS certificate "
                f"this host does not trust ({untrusted}); name its CA in ca_file"
            )
        if problem:
            log.warning("mqtt output %r: %s; retrying in the background", self.name, problem)

    def _untrusted_certificate(self) -> str | None:
        """Why the broker's certificate fails the checks paho's TLS makes (the CA file or the
        system's, the host name), or ``None``: paho's thread says only that it could not
        connect, and no reconnecting mends a certificate this host does not trust."""
        address = self._address
        context = ssl.create_default_context(cafile=self._options.ca_file)
        try:
            with socket.create_connection((address.host, address.port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname=address.host):
                    return None
        except ssl.SSLCertVerificationError as exc:
            return exc.verify_message or str(exc)
        except OSError:  # not listening, another TLS failure: an outage, retried
            return None

    def deliver(self, events: Sequence[ObjectEvent]) -> None:
        from paho.mqtt.client import MQTT_ERR_NO_CONN, MQTT_ERR_SUCCESS

        if self._closed.is_set():
            raise OutputUnavailable(f"mqtt output {self.name!r} closed")
        if not self._client.is_connected():
            with self._lock:
                raise OutputUnavailable(self._problem or f"MQTT broker {self._where} away")
        pending, counts = [], {}
        for event in events:
            payload = json.dumps(event.to_json(), separators=(",", ":"))
            pending.append(self._client.publish(events_topic(self._prefix), payload, qos=1))
            topic = count_topic(self._prefix, event)
            if topic is not None and self._newer(topic, event, counts):
                counts[topic] = (event.time, event.seq, event.index)
                pending.append(self._client.publish(topic, str(event.count), qos=1, retain=True))
        for info in pending:
            if info.rc not in (MQTT_ERR_SUCCESS, MQTT_ERR_NO_CONN):  # NO_CONN: queued
                raise OutputUnavailable(
                    f"MQTT publish to {self._where} failed: paho error {info.rc}"
                )
        deadline = time.monotonic() + self._options.publish_timeout_s
        for info in pending:
            while not info.is_published():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OutputUnavailable(
                        f"MQTT broker {self._where}: no PUBACK within "
                        f"{self._options.publish_timeout_s:g} s"
                    )
                if self._closed.wait(min(left, 0.05)):
                    raise OutputUnavailable(f"mqtt output {self.name!r} closed")
        self._counts.update(counts)

    def _newer(
        self, topic: str, event: ObjectEvent, batch: dict[str, tuple[float, int, int]]
    ) -> bool:
        shown = batch.get(topic) or self._counts.get(topic)
        return shown is None or (event.time, event.seq, event.index) >= shown

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._client.disconnect()
        self._client.loop_stop()


def open_output(options: Options) -> MqttOutput:
    output = MqttOutput(options)
    output.wait_first_connect()
    return output
