"""The outputs relay against a real redis-server, a real mosquitto and a real HTTP receiver on
loopback: every event delivered (exactly once after de-duplication by id), through a broker
restart, a relay killed before it acknowledged, and a receiver that answers 500 for good (the
pipeline's writes never wait; what the stream's cap trims away is counted dropped)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import av
import pytest
import redis

from pipeline.errors import BadInput
from pipeline.supervisor.outputs import OutputsPart
from streams.embedded_redis import EmbeddedRedis, free_tcp_port
from streams.keys import StreamKeys
from streams.object_events import ObjectEvent
from streams.outputs import mqtt, webhook
from streams.outputs import relay as relay_module
from streams.outputs.base import OutputError
from streams.outputs.relay import OutputRelay, OutputStats, output_group
from streams.redis_connect import connect
from tests.conftest import MODEL, REPO_ROOT, VIDEOS
from tests.integration.runner import start_daemon, stop_daemon, write_config
from tests.integration.servers import LoopbackServer

pytestmark = pytest.mark.integration

paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed")

MOSQUITTO = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/sbin")
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd")
OPENSSL = shutil.which("openssl")
SECRET = b"webhook-secret"


# --- helpers ------------------------------------------------------------------------------------
def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)


def event(camera: str, seq: int, **changes: Any) -> ObjectEvent:
    values: dict[str, Any] = {
        "kind": "zone_enter",
        "camera": camera,
        "session": f"S-{camera}",  # a decoder session is one camera's: ids differ
        "seq": seq,
        "index": 0,
        "pts": seq / 10,
        "time": 1_000.0 + seq,
        "track_id": seq,
        "class_id": 2,
        "label": "car",
        "score": 0.9,
        "box": (1.0, 2.0, 3.0, 4.0),
        "region": "door",
        "count": seq,
    }
    return ObjectEvent(**{**values, **changes})


def write(
    client: redis.Redis, keys: StreamKeys, events: list[ObjectEvent], maxlen: int | None = None
) -> None:
    """What the pipeline does (its MAXLEN is ~; exact here, so the counts are exact)."""
    for e in events:
        client.xadd(keys.object_events(e.camera), e.to_fields(), maxlen=maxlen, approximate=False)


def events_of(camera: str, seqs: range) -> list[ObjectEvent]:
    return [event(camera, seq) for seq in seqs]


def ids(events: list[ObjectEvent]) -> set[str]:
    return {e.id for e in events}


# --- a real HTTP receiver -----------------------------------------------------------------------
class Receiver:
    """Records each POST; answers ``status`` (a value or a callable of the request count)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.status: int = 200
        self.max_events: int | None = None  # more in one request: 413
        self.too_large_id: str | None = None  # a request with this event: 413, even alone
        self.answered: list[int] = []  # the status of each request
        self.hold = threading.Event()  # set: each request waits until released
        self.released = threading.Event()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.requests.append((dict(self.headers.items()), body))
                    receiver.answered.append(413 if receiver.too_large(body) else receiver.status)
                if receiver.hold.is_set():
                    receiver.released.wait(30)
                status = 413 if receiver.too_large(body) else receiver.status
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def too_large(self, body: bytes) -> bool:
        events = json.loads(body)["events"]
        if self.max_events is not None and len(events) > self.max_events:
            return True
        return self.too_large_id is not None and any(e["id"] == self.too_large_id for e in events)

    def received(self, status: int | None = None) -> list[str]:
        """Every event id of every request (answered ``status``, if given), repeats included,
        in order."""
        with self.lock:
            bodies = [
                body
                for (_, body), answer in zip(self.requests, self.answered, strict=True)
                if status is None or answer == status
            ]
        return [e["id"] for body in bodies for e in json.loads(body)["events"]]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


# --- a real MQTT broker -------------------------------------------------------------------------
def make_certificates(folder: Path) -> Path:
    """A CA of the test's own and a certificate it signed for 127.0.0.1 (``server.crt``,
    ``server.key``) in ``folder``; returns the CA's certificate."""

    def openssl(command: str) -> None:
        subprocess.run([OPENSSL, *command.split()], cwd=folder, check=True, capture_output=True)

    key = "-newkey rsa:2048 -nodes -days 2"
    openssl(f"req -x509 {key} -keyout ca.key -out ca.crt -subj /CN=framebatch-test-CA")
    openssl(f"req {key} -keyout server.key -out server.csr -subj /CN=127.0.0.1")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt "
        "-days 2 -extfile san.cnf"
    )
    return folder / "ca.crt"


class Mosquitto(LoopbackServer):
    """mosquitto with a password and persistent sessions; with ``tls``, its listener speaks TLS
    only, with a certificate from a CA of its own."""

    name = "mosquitto"

    def __init__(
        self, folder: Path, user: str = "relay", password: str = "s3cret", *, tls: bool = False
    ):
        super().__init__(folder)
        self.user, self.password = user, password
        subprocess.run(
            [MOSQUITTO_PASSWD, "-b", "-c", str(folder / "passwords"), user, password],
            check=True,
            capture_output=True,
        )
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous false",
            f"password_file {folder / 'passwords'}",
            "persistence true",  # a subscriber's session outlives a restart
            f"persistence_location {folder}/",
        ]
        self.ca_file: Path | None = make_certificates(folder) if tls else None
        if self.ca_file is not None:
            lines += [f"cafile {self.ca_file}", f"certfile {folder / 'server.crt'}"]
            lines.append(f"keyfile {folder / 'server.key'}")
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to 'mosquitto', who cannot read tmp_path
        (folder / "mosquitto.conf").write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        return [MOSQUITTO, "-c", str(self.folder / "mosquitto.conf")]

    def url(self, password: str | None = None) -> str:
        scheme = "mqtts" if self.ca_file is not None else "mqtt"
        return f"{scheme}://{self.user}:{password or self.password}@127.0.0.1:{self.port}"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    if MOSQUITTO is None or MOSQUITTO_PASSWD is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    server = Mosquitto(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    if MOSQUITTO is None or MOSQUITTO_PASSWD is None or OPENSSL is None:
        pytest.skip("mosquitto or openssl is not installed (apt-get install mosquitto openssl)")
    server = Mosquitto(tmp_path, tls=True)
    server.start()
    yield server
    server.stop()


class Subscriber:
    """A persistent QoS 1 session on ``<prefix>/#``: what a receiver of the output sees."""

    def __init__(self, broker: Mosquitto, topics: str, client_id: str):
        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False
        )
        self.client.username_pw_set(broker.user, broker.password)
        if broker.ca_file is not None:
            self.client.tls_set(ca_certs=str(broker.ca_file))
        self.client.reconnect_delay_set(1, 1)

        def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any):
            if not reason.is_failure:
                client.subscribe(topics, qos=1)

        def on_subscribe(*args: Any) -> None:
            self.subscribed.set()

        def on_message(client: Any, userdata: Any, message: Any) -> None:
            with self.lock:
                self.messages.append((message.topic, message.payload, bool(message.retain)))

        self.client.on_connect, self.client.on_message = on_connect, on_message
        self.client.on_subscribe = on_subscribe
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        assert self.subscribed.wait(10), "subscriber never subscribed"

    def event_ids(self, topic: str) -> list[str]:
        with self.lock:
            return [json.loads(p)["id"] for t, p, _ in self.messages if t == topic]

    def topics(self) -> dict[str, tuple[bytes, bool]]:
        with self.lock:
            return {t: (p, r) for t, p, r in self.messages}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def relay_of(
    made: list[OutputRelay],
    client: redis.Redis,
    keys: StreamKeys,
    cameras: Callable[[], list[str]],
    *options: Any,
    **kwargs: Any,
) -> OutputRelay:
    relay = OutputRelay(
        options, redis_client=client, keys=keys, cameras=cameras, poll_s=0.05, **kwargs
    )
    made.append(relay)
    relay.start()
    return relay


# --- MQTT -------------------------------------------------------------------------------------
def test_mqtt_delivers_every_event_once_and_sets_the_count_topics(
    redis_client: redis.Redis, prefix: str, broker: Mosquitto, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    watcher = Subscriber(broker, f"{prefix}/#", f"watch-{prefix}")
    cameras = ["door"]
    written = events_of("door", range(1, 31))
    write(redis_client, keys, written[:10])  # before the relay: read from the group's start
    options = mqtt.Options(url=broker.url(), topic_prefix=prefix, batch_size=7)
    relay = relay_of(relays, redis_client, keys, lambda: list(cameras), options)
    write(redis_client, keys, written[10:20])
    cameras.append("yard")  # a camera added while it runs
    late = [event("yard", 1, kind="line_cross", region="gate", direction="in", count=4)]
    late.append(event("yard", 2, kind="track_start", region="", count=None))
    write(redis_client, keys, written[20:] + late)

    everything = ids(written + late)
    got = wait_for(
        lambda: (e := watcher.event_ids(f"{prefix}/events")) and set(e) == everything and e,
        "every event on <prefix>/events",
    )
    assert len(got) == len(everything)  # no repeats without a failure
    topics = watcher.topics()
    assert topics[f"{prefix}/door/door/car"][0] == b"30"  # the newest count
    assert topics[f"{prefix}/yard/gate/car/in"][0] == b"4"
    assert not any(t.startswith(f"{prefix}/yard/") and t.count("/") == 3 for t in topics)
    # pending and backlog are as of the relay's last look: its next poll after the PUBACKs
    stats = wait_for(
        lambda: (now := relay.stats()["mqtt"]).delivered == 32 and now.pending == 0 and now,
        "the PUBACKs counted and acknowledged",
    )
    assert (dict(stats.dropped), stats.failing, stats.backlog, stats.pending) == ({}, False, 0, 0)
    watcher.close()

    late_comer = Subscriber(broker, f"{prefix}/+/+/+/#", f"late-{prefix}")  # retained counts
    wait_for(lambda: f"{prefix}/door/door/car" in late_comer.topics(), "the retained count")
    assert late_comer.topics()[f"{prefix}/door/door/car"] == (b"30", True)
    late_comer.close()


def test_mqtt_broker_restarted_mid_run_loses_nothing(
    redis_client: redis.Redis, prefix: str, broker: Mosquitto, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    watcher = Subscriber(broker, f"{prefix}/events", f"watch-{prefix}")
    options = mqtt.Options(
        url=broker.url(),
        topic_prefix=prefix,
        batch_size=5,
        retry_max_s=0.3,
        publish_timeout_s=2,
        reconnect_max_s=1,
    )
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    before, during, after = (
        events_of("door", range(a, b)) for a, b in ((1, 11), (11, 21), (21, 31))
    )
    write(redis_client, keys, before)
    wait_for(lambda: relay.stats()["mqtt"].delivered == 10, "the first events delivered")

    broker.stop()
    write(redis_client, keys, during)  # written while the broker is down: they wait in Redis
    wait_for(lambda: relay.stats()["mqtt"].failing, "the relay to see the broker gone")
    assert relay.stats()["mqtt"].delivered == 10
    broker.start()
    write(redis_client, keys, after)

    everything = ids(before + during + after)
    wait_for(
        lambda: set(watcher.event_ids(f"{prefix}/events")) == everything,
        "every event, those written during the outage included",
        timeout_s=30,
    )
    wait_for(lambda: relay.stats()["mqtt"].delivered >= 30, "the PUBACKs counted")
    stats = relay.stats()["mqtt"]
    assert not stats.dropped and not stats.failing
    assert stats.last_error is not None and broker.password not in stats.last_error
    watcher.close()


def test_mqtt_broker_back_is_delivered_to_at_once_not_after_the_relays_backoff(
    broker: Mosquitto,
    redis_client: redis.Redis,
    prefix: str,
    relays: list[OutputRelay],
    monkeypatch: pytest.MonkeyPatch,
):
    """The relay's waits between tries are made minutes long here: only the output saying
    its broker is back can deliver within the test's wait (they held events 5-25 s after a
    broker came back, with the defaults)."""
    monkeypatch.setattr(relay_module, "RETRY_BASE_S", 300.0)
    keys = StreamKeys(prefix)
    watcher = Subscriber(broker, f"{prefix}/events", f"watch-{prefix}")
    options = mqtt.Options(
        url=broker.url(),
        topic_prefix=prefix,
        retry_max_s=600,
        claim_idle_s=3600,
        publish_timeout_s=2,
        reconnect_max_s=1,
    )
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    broker.stop()
    written = events_of("door", range(1, 6))
    write(redis_client, keys, written)
    wait_for(lambda: relay.stats()["mqtt"].failing, "the relay to see the broker gone")
    broker.start()
    wait_for(
        lambda: set(watcher.event_ids(f"{prefix}/events")) == ids(written),
        "every event, once the broker is back",
        timeout_s=60,
    )
    watcher.close()


def test_mqtt_wrong_password_is_one_clear_line_without_it(
    broker: Mosquitto, redis_client: redis.Redis
):
    wrong = "not-the-Pa55word"
    options = mqtt.Options(url=broker.url(password=wrong))
    with pytest.raises(OutputError) as caught:
        mqtt.open_output(options)
    message = str(caught.value)
    assert "\n" not in message and wrong not in message
    assert f"mqtt://{broker.user}:***@127.0.0.1:{broker.port}" in message
    assert "refused the user name or password" in message
    assert wrong not in repr(options)

    # in a run: bad input at start, exit 2, the same line
    with pytest.raises(BadInput) as at_start:
        OutputsPart([options], client=redis_client, keys=StreamKeys("x"), cameras=list)
    assert str(at_start.value) == message


def test_mqtts_delivers_to_a_tls_broker_whose_ca_is_named(
    redis_client: redis.Redis, prefix: str, tls_broker: Mosquitto, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    watcher = Subscriber(tls_broker, f"{prefix}/#", f"watch-{prefix}")
    options = mqtt.Options(
        url=tls_broker.url(), ca_file=str(tls_broker.ca_file), topic_prefix=prefix
    )
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    written = events_of("door", range(1, 11))
    write(redis_client, keys, written)
    wait_for(
        lambda: set(watcher.event_ids(f"{prefix}/events")) == ids(written),
        "every event through the TLS listener",
    )
    assert watcher.topics()[f"{prefix}/door/door/car"][0] == b"10"
    wait_for(lambda: relay.stats()["mqtt"].delivered == 10, "the PUBACKs counted")
    assert "New client connected" in tls_broker.log()  # through TLS: the listener has no other
    watcher.close()


def test_mqtts_a_certificate_this_host_does_not_trust_is_one_clear_line(
    tls_broker: Mosquitto, redis_client: redis.Redis
):
    options = mqtt.Options(url=tls_broker.url(), connect_timeout_s=5)  # the system's CAs
    with pytest.raises(OutputError) as caught:
        mqtt.open_output(options)
    message = str(caught.value)
    assert "\n" not in message and tls_broker.password not in message
    assert f"mqtts://{tls_broker.user}:***@127.0.0.1:{tls_broker.port}" in message
    assert "certificate this host does not trust (self-signed certificate" in message
    assert message.endswith("; name its CA in ca_file")
    with pytest.raises(BadInput) as at_start:
        OutputsPart([options], client=redis_client, keys=StreamKeys("x"), cameras=list)
    assert str(at_start.value) == message


@pytest.mark.parametrize("content", [None, "not a certificate\n"])
def test_mqtts_a_ca_file_that_is_missing_or_no_certificate_is_named(
    tmp_path: Path, content: str | None
):
    ca_file = tmp_path / "ca.pem"
    if content is not None:
        ca_file.write_text(content)
    url = f"mqtts://relay:s3cret@127.0.0.1:{free_tcp_port()}"
    with pytest.raises(OutputError) as caught:
        mqtt.open_output(mqtt.Options(url=url, ca_file=str(ca_file), connect_timeout_s=1))
    assert str(caught.value).startswith(f"mqtt output 'mqtt': ca_file '{ca_file}': ")
    assert "s3cret" not in str(caught.value)


def test_mqtt_broker_down_at_start_is_an_outage_not_bad_input(tmp_path: Path):
    url = f"mqtt://relay:s3cret@127.0.0.1:{free_tcp_port()}"
    output = mqtt.open_output(mqtt.Options(url=url, connect_timeout_s=2))  # no raise
    try:
        with pytest.raises(mqtt.OutputUnavailable) as caught:
            output.deliver([event("door", 1)])
        assert "s3cret" not in str(caught.value)
    finally:
        output.close()


# --- webhook ----------------------------------------------------------------------------------
def test_webhook_batches_are_signed_and_verifiable(
    redis_client: redis.Redis, prefix: str, receiver: Receiver, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    written = events_of("door", range(1, 24)) + events_of("yard", range(1, 5))
    write(redis_client, keys, written)
    options = webhook.Options(url=receiver.url, secret=SECRET.decode(), batch_size=10)
    relay = relay_of(relays, redis_client, keys, lambda: ["door", "yard"], options)
    wait_for(lambda: set(receiver.received()) == ids(written), "every event at the receiver")
    assert len(receiver.received()) == len(written)
    for headers, body in receiver.requests:
        assert webhook.verify(body, SECRET, headers[webhook.SIGNATURE_HEADER])
        assert not webhook.verify(body + b" ", SECRET, headers[webhook.SIGNATURE_HEADER])
        sent = [e["id"] for e in json.loads(body)["events"]]
        assert headers[webhook.EVENT_IDS_HEADER].split(",") == sent
        assert len(sent) <= 10
        assert [ObjectEvent.from_json(e).id for e in json.loads(body)["events"]] == sent
    assert relay.stats()["webhook"].delivered == len(written)
    group = output_group("webhook")
    assert redis_client.xpending(keys.object_events("door"), group)["pending"] == 0


def test_webhook_refusal_is_counted_dropped_and_the_relay_goes_on(
    redis_client: redis.Redis, prefix: str, receiver: Receiver, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    receiver.status = 422
    write(redis_client, keys, events_of("door", range(1, 8)))
    relay = relay_of(
        relays, redis_client, keys, lambda: ["door"], webhook.Options(url=receiver.url)
    )
    wait_for(lambda: relay.stats()["webhook"].dropped.get("rejected") == 7, "7 rejected")
    receiver.status = 200
    write(redis_client, keys, events_of("door", range(8, 10)))
    wait_for(lambda: relay.stats()["webhook"].delivered == 2, "the next events delivered")
    stats = relay.stats()["webhook"]
    assert "HTTP 422" in (stats.last_error or "") and not stats.failing


def test_webhook_500_forever_never_blocks_writes_and_counts_what_is_trimmed(
    redis_client: redis.Redis, prefix: str, receiver: Receiver, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    receiver.status = 500
    maxlen, total, batch = 20, 200, 5
    options = webhook.Options(url=receiver.url, retries=0, batch_size=batch, retry_max_s=0.2)
    written = events_of("door", range(1, total + 1))
    write(redis_client, keys, written[:batch])
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    wait_for(lambda: receiver.received(), "the first failed delivery")

    # the pipeline's writes, while the output fails: plain XADDs the relay never holds up
    write(redis_client, keys, written[batch:], maxlen=maxlen)

    def accounted() -> OutputStats | None:
        s = relay.stats()["webhook"]
        return s if s.dropped.get("trimmed", 0) + s.held + s.backlog == total else None

    stats = wait_for(accounted, "every event delivered, held, waiting or counted trimmed")
    assert stats.delivered == 0 and stats.held == batch
    # re-claiming them between tries drops the trimmed ones from the group's pending list
    assert stats.pending <= batch
    assert stats.backlog == maxlen  # the stream's cap bounds what waits
    assert stats.dropped == {"trimmed": total - maxlen - batch}
    assert "HTTP 500" in (stats.last_error or "")

    receiver.status = 200  # the receiver is back: what waited is delivered, once
    wait_for(lambda: relay.stats()["webhook"].delivered == batch + maxlen, "the backlog")
    delivered = [i for i in receiver.received()]
    kept = ids(written[:batch] + written[-maxlen:])
    assert set(delivered) == kept
    assert relay.stats()["webhook"].dropped == {"trimmed": total - maxlen - batch}


_RELAY_PROCESS = """
import sys, time
import redis
from streams.keys import StreamKeys
from streams.outputs import webhook
from streams.outputs.relay import OutputRelay
url, prefix, hook = sys.argv[1:4]
relay = OutputRelay(
    [webhook.Options(url=hook, batch_size=5, timeout_s=60, retries=0)],
    redis_client=redis.Redis.from_url(url), keys=StreamKeys(prefix), cameras=lambda: ["door"],
    consumer="doomed",
)
relay.start()
while True:
    time.sleep(1)
"""


def test_a_relay_killed_before_its_ack_repeats_and_never_loses(
    redis_url: str,
    redis_client: redis.Redis,
    prefix: str,
    receiver: Receiver,
    relays: list[OutputRelay],
):
    keys = StreamKeys(prefix)
    written = events_of("door", range(1, 13))
    write(redis_client, keys, written)
    receiver.hold.set()  # the first delivery reaches the receiver, and is never answered
    process = subprocess.Popen(
        [sys.executable, "-c", _RELAY_PROCESS, redis_url, prefix, receiver.url],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: receiver.received(), "the doomed relay's first delivery", timeout_s=30)
    finally:
        process.kill()
        process.wait(10)
    first = receiver.received()
    assert first == [e.id for e in written[:5]]
    key, group = keys.object_events("door"), output_group("webhook")
    assert redis_client.xpending(key, group)["pending"] == 5  # read, never acknowledged

    receiver.hold.clear()
    receiver.released.set()
    options = webhook.Options(
        url=receiver.url, batch_size=5, claim_idle_s=1, timeout_s=0.5, retries=0
    )
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    wait_for(lambda: set(receiver.received()) == ids(written), "every event after the crash")
    wait_for(lambda: relay.stats()["webhook"].delivered == len(written), "the claimed ones too")
    received = receiver.received()
    assert sorted(received) == sorted(first + [e.id for e in written])  # the 5 repeated, once
    assert redis_client.xpending(key, group)["pending"] == 0

    def consumers() -> set[bytes]:
        return {c["name"] for c in redis_client.xinfo_consumers(key, group)}

    wait_for(lambda: b"doomed" not in consumers(), "the dead consumer forgotten")
    assert consumers() == {relay.consumer.encode()}


def test_two_relays_share_one_output_without_repeats(
    redis_client: redis.Redis, prefix: str, receiver: Receiver, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    options = webhook.Options(url=receiver.url, batch_size=3)
    for _ in range(2):
        relay_of(relays, redis_client, keys, lambda: ["door", "yard"], options)
    written = events_of("door", range(1, 41)) + events_of("yard", range(1, 41))
    write(redis_client, keys, written)
    wait_for(lambda: set(receiver.received()) == ids(written), "every event")
    assert len(receiver.received()) == len(written)
    assert sum(r.stats()["webhook"].delivered for r in relays) == len(written)


def test_a_daemon_delivers_its_cameras_events_to_mqtt_and_a_webhook(
    assets, redis_url, prefix, broker: Mosquitto, receiver: Receiver, tmp_path: Path
):
    """``framebatch run`` on the highway clip with a line and a zone, an MQTT output and a
    webhook: every event the camera wrote to Redis reaches both, once after de-duplication
    by id, with the line's count retained on its topic."""
    keys, camera = StreamKeys(prefix), "highway"
    watcher = Subscriber(broker, f"{prefix}/#", f"watch-{prefix}")
    analytics = {
        "tracker": {},
        "lines": {"gate": {"start": [100, 300], "end": [860, 300]}},
        "zones": {"near": {"polygon": [[150, 250], [800, 250], [960, 540], [0, 540]]}},
    }
    port = free_tcp_port()
    config = write_config(
        tmp_path / "outputs.yaml",
        model=MODEL,
        cameras=[
            {
                "id": camera,
                "url": str(VIDEOS / "highway_traffic_960x540_30fps.mp4"),
                "realtime": False,
                "analytics": analytics,
            }
        ],
        redis_url=redis_url,
        prefix=prefix,
        outputs=[
            {"kind": "mqtt", "url": broker.url(), "topic_prefix": prefix},
            {"kind": "webhook", "url": receiver.url, "secret": SECRET.decode()},
        ],
        http={"listen": f"127.0.0.1:{port}"},
    )
    with av.open(str(VIDEOS / "highway_traffic_960x540_30fps.mp4")) as clip:
        frames = clip.streams.video[0].frames
    client = redis.Redis.from_url(redis_url)
    proc = start_daemon(config)
    try:

        def all_delivered() -> bool:
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            ended = client.xlen(keys.detections(camera)) == frames  # every frame published
            stored = {
                ObjectEvent.from_fields(f).id for _, f in client.xrange(keys.object_events(camera))
            }
            return bool(
                stored
                and set(watcher.event_ids(f"{prefix}/events")) == stored
                and set(receiver.received()) == stored
                and ended
            )

        wait_for(all_delivered, "every event at both outputs", timeout_s=240)
        stored_count = client.xlen(keys.object_events(camera))

        def counted() -> str | None:  # the relay counts a delivery once its receiver acked
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
                text = page.read().decode()
            lines = [
                f'framebatch_output_events_delivered_total{{kind="{kind}",output="{kind}"}} '
                f"{float(stored_count)}"
                for kind in ("mqtt", "webhook")
            ]
            return text if all(line in text for line in lines) else None

        metrics = wait_for(counted, "both outputs' deliveries counted in /metrics")
    finally:
        code, _, err = stop_daemon(proc)
        watcher.close()
    assert code == 0, err[-3000:]
    stored = [ObjectEvent.from_fields(f) for _, f in client.xrange(keys.object_events(camera))]
    assert {e.kind for e in stored} >= {"track_start", "line_cross", "zone_enter"}
    crossings = [e for e in stored if e.kind == "line_cross"]
    last = crossings[-1]
    topic = f"{prefix}/{camera}/gate/{last.label}/{last.direction}"
    assert watcher.topics()[topic][0] == str(last.count).encode()
    # what the operator sees: every event delivered to each (above), none dropped
    assert len(stored) == stored_count
    assert "framebatch_output_events_dropped_total{" not in metrics
    client.close()


def test_webhook_away_answers_wait_and_a_batch_too_large_is_split(
    redis_client: redis.Redis, prefix: str, receiver: Receiver, relays: list[OutputRelay]
):
    """A 404 (a receiver being redeployed) is the receiver away: the events wait and are
    delivered once it is back, none dropped; a 413 splits the batch until it fits."""
    keys = StreamKeys(prefix)
    written = events_of("door", range(1, 21))
    write(redis_client, keys, written)
    receiver.status = 404
    options = webhook.Options(url=receiver.url, retries=0, batch_size=10, retry_max_s=0.2)
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    wait_for(lambda: relay.stats()["webhook"].failing, "the output failing on 404")
    assert relay.stats()["webhook"].delivered == 0 and not relay.stats()["webhook"].dropped

    receiver.max_events = 3  # back, behind a proxy that takes at most 3 events a request
    receiver.status = 200
    wait_for(lambda: relay.stats()["webhook"].delivered == len(written), "every event")
    delivered = receiver.received(status=200)
    assert sorted(delivered) == sorted(ids(written)) and len(delivered) == len(written)
    assert 413 in receiver.answered
    assert not relay.stats()["webhook"].dropped


def test_webhook_one_event_too_large_is_the_only_one_refused_of_its_batch(
    redis_client: redis.Redis, prefix: str, receiver: Receiver, relays: list[OutputRelay]
):
    """The batch is split around the event the receiver will not take even alone: the others
    are delivered, once each, and only that one is counted refused."""
    keys = StreamKeys(prefix)
    written = events_of("door", range(1, 11))
    receiver.too_large_id = written[2].id
    write(redis_client, keys, written)
    options = webhook.Options(url=receiver.url, retries=0, batch_size=10)
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    wait_for(lambda: relay.stats()["webhook"].dropped.get("rejected") == 1, "one refused")
    delivered = receiver.received(status=200)
    assert sorted(delivered) == sorted(ids(written) - {written[2].id})
    assert len(delivered) == len(written) - 1
    stats = relay.stats()["webhook"]
    assert stats.delivered == len(written) - 1 and stats.dropped == {"rejected": 1}
    pending = redis_client.xpending(keys.object_events("door"), output_group("webhook"))
    assert pending["pending"] == 0


class TricklingReceiver:
    """Trickles its answer a byte at a time, each well within any socket timeout: its status
    line (never ending), or a 200's body of 100,000 bytes (hours for the whole answer)."""

    def __init__(self, trickled: str) -> None:
        self.trickled = trickled
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket) -> None:
        with connection:
            connection.recv(65536)  # the request (small: one event)
            if self.trickled == "status":
                connection.sendall(b"HTTP/1.1 ")
            else:
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.wait(0.2):
                try:
                    connection.sendall(b"x")
                except OSError:  # cut by the client
                    return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def test_webhook_a_receiver_that_trickles_its_answer_is_cut_at_the_timeout():
    receiver = TricklingReceiver("status")
    output = webhook.WebhookOutput(
        webhook.Options(url=receiver.url, timeout_s=1, retries=0), secret=None
    )
    started = time.monotonic()
    try:
        with pytest.raises(webhook.OutputUnavailable, match=r"no whole answer in 1 s"):
            output.deliver([event("door", 1)])
    finally:
        output.close()
        receiver.close()
    assert time.monotonic() - started < 60  # not the hours of the whole answer


def test_webhook_a_200_whose_body_trickles_is_a_delivery_once_cut_at_the_timeout():
    receiver = TricklingReceiver("body")
    output = webhook.WebhookOutput(
        webhook.Options(url=receiver.url, timeout_s=1, retries=2), secret=None
    )
    try:
        output.deliver([event("door", 1)])  # no raise, and not sent again
    finally:
        output.close()
        receiver.close()
    assert receiver.requests == 1


def test_a_stop_with_redis_gone_waits_for_neither_redis_nor_the_receiver(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
):
    """Redis goes while the output waits between tries of a failing receiver: the counts
    made during the wait and at the stop go through a client that fails fast, so the stop
    does not wait out the run's client reconnecting (two minutes here)."""
    server = EmbeddedRedis().start()
    try:
        client = connect(server.url, reconnect_timeout_s=120)
        keys = StreamKeys("gone")
        write(client, keys, events_of("door", range(1, 6)))
        receiver.status = 500
        part = OutputsPart(
            [webhook.Options(url=receiver.url, retries=0, retry_max_s=0.2)],
            client=client,
            keys=keys,
            cameras=lambda: ["door"],
            fail_fast=connect(server.url, fail_fast=True),
        )
        part.start()
        # the second try re-claims the events in hand (the next in claim_idle_s / 3): only
        # the counts go to Redis until then
        wait_for(lambda: len(receiver.requests) >= 3, "the output failing on 500")
        server.stop()
        time.sleep(0.5)  # a wait or two between tries with Redis gone
        started = time.monotonic()
        part.stop()
        assert time.monotonic() - started < 60
    finally:
        server.stop()
    assert not [r for r in caplog.records if "did not stop in time" in r.getMessage()]
    (said,) = [r.getMessage() for r in caplog.records if "not delivered at stop" in r.getMessage()]
    assert said.startswith("output 'webhook': 5 events not delivered at stop (0 unread, 5 read")
