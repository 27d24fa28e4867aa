"""Event outputs, pure logic: the registry, options and their errors (never echoing a password),
MQTT topic names, the webhook's signature and answers, the backoff."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from pydantic import BaseModel, Field, ValidationError

from pipeline.config.errors import format_validation_errors
from pipeline.config.fields import MODEL_CONFIG
from pipeline.config.outputs import Outputs
from pipeline.errors import BadInput
from pipeline.supervisor.outputs import _check_redis_version
from streams.object_events import ObjectEvent
from streams.outputs import output_modules, output_options_models
from streams.outputs.base import OutputError, backoff_delay
from streams.outputs.mqtt import Options as MqttOptions
from streams.outputs.mqtt import count_topic, events_topic, parse_url
from streams.outputs.relay import output_group
from streams.outputs.webhook import (
    Options as WebhookOptions,
)
from streams.outputs.webhook import (
    batch_body,
    is_retryable,
    retry_after_s,
    secret_of,
    sign,
    verify,
)
from tests.object_events import sample_event


class FakeConfig(BaseModel):
    """The ``outputs:`` key as the config declares it."""

    model_config = MODEL_CONFIG
    outputs: Outputs = Field(default_factory=list)


def errors_of(outputs: list[dict]) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        FakeConfig(outputs=outputs)
    return format_validation_errors(caught.value, FakeConfig)


def event(**changes) -> ObjectEvent:
    """A car entering the door camera's drive zone (its count topic: ``fb/door/drive/car``)."""
    zone_entry = dict(kind="zone_enter", camera="door", region="drive", direction="", count=2)
    return sample_event(**{**zone_entry, **changes})


def test_each_output_module_is_registered_under_its_own_name():
    modules = output_modules()
    assert {"mqtt", "webhook"} <= set(modules)
    for kind, module in modules.items():
        assert module.__name__ == f"streams.outputs.{kind}"
        assert callable(module.open_output)
    assert len(output_options_models()) == len(modules)
    assert FakeConfig().outputs == []


def test_a_config_of_both_outputs_validates():
    config = FakeConfig(
        outputs=[
            {"kind": "mqtt", "url": "mqtts://u:p@broker", "ca_file": "/ca.pem"},
            {"kind": "webhook", "url": "https://hooks.example/x", "name": "hook", "retries": 1},
        ]
    )
    broker, hook = config.outputs
    assert (broker.output_name, hook.output_name) == ("mqtt", "hook")
    assert output_group(hook.output_name) == "output:hook"


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (
            [{"kind": "mqtt", "url": "mqtt://a"}, {"kind": "mqtt", "url": "mqtt://b"}],
            "outputs[1].name: duplicate output name 'mqtt' (also outputs[0])",
        ),
        ([{"kind": "kafka"}], "outputs[0].kind: unknown 'kafka' (one of: mqtt, nats, webhook)"),
        (
            [{"kind": "nats", "url": "nats://h", "subject_prefix": "a.>"}],
            "outputs[0].subject_prefix: must be subject tokens joined by '.', without '*', '>' "
            "or spaces",
        ),
        (
            [{"kind": "webhook", "url": "ftp://x"}],
            "outputs[0].url: must be an http:// or https:// URL with a host",
        ),
        (
            [{"kind": "webhook", "url": "http://x", "retires": 2}],
            "outputs[0]: unknown key 'retires'; did you mean 'retries'?",
        ),
        (
            [{"kind": "mqtt", "url": "mqtt://x", "name": "a b"}],
            "outputs[0].name: invalid output name",
        ),
        ([{"kind": "mqtt", "url": "mqtt://x", "batch_size": 0}], "outputs[0].batch_size"),
        (
            [{"kind": "mqtt", "url": "mqtt://x", "topic_prefix": "a/#"}],
            "outputs[0].topic_prefix: must be a non-empty topic",
        ),
    ],
)
def test_output_config_errors_read_like_directions(outputs: list[dict], expected: str):
    assert any(line.startswith(expected) for line in errors_of(outputs)), errors_of(outputs)


@pytest.mark.parametrize(
    "url", ["http://user:hunter2@broker", "mqtt://user:hunter2@", "mqtt://user:hunter2@h:99999"]
)
def test_a_bad_mqtt_url_error_never_shows_its_password(url: str):
    lines = errors_of([{"kind": "mqtt", "url": url}])
    assert lines == ["outputs[0].url: must be mqtt://[user:password@]host[:port] or mqtts://..."]
    assert "hunter2" not in repr(MqttOptions(url="mqtt://user:hunter2@h"))
    assert "hunter2" not in repr(WebhookOptions(url="http://h", secret="hunter2"))


@pytest.mark.parametrize(
    ("url", "host", "port", "tls", "user", "password"),
    [
        ("mqtt://broker", "broker", 1883, False, None, None),
        ("mqtts://broker", "broker", 8883, True, None, None),
        ("mqtt://u:p%40ss@10.0.0.2:1884", "10.0.0.2", 1884, False, "u", "p@ss"),
        ("mqtts://u@[::1]:8884", "::1", 8884, True, "u", None),
    ],
)
def test_mqtt_urls(url, host, port, tls, user, password):
    address = parse_url(url)
    assert (address.host, address.port, address.tls) == (host, port, tls)
    assert (address.username, address.password) == (user, password)


@pytest.mark.parametrize(
    ("changes", "topic"),
    [
        ({}, "fb/door/drive/car"),
        ({"kind": "zone_exit", "count": 0}, "fb/door/drive/car"),
        ({"kind": "line_cross", "region": "gate", "direction": "in"}, "fb/door/gate/car/in"),
        ({"kind": "line_cross", "region": "gate", "direction": "out"}, "fb/door/gate/car/out"),
        ({"label": "traffic light"}, "fb/door/drive/traffic light"),
        ({"label": "a/b+#"}, "fb/door/drive/a_b__"),  # never a level or a wildcard
        ({"kind": "track_start", "region": "", "count": None}, None),
        ({"kind": "loiter", "count": None}, None),
    ],
)
def test_mqtt_count_topics(changes: dict, topic: str | None):
    assert count_topic("fb", event(**changes)) == topic
    assert events_topic("fb") == "fb/events"


def test_webhook_signature_is_the_hmac_of_the_body():
    body = batch_body([event(), event(seq=8)])
    expected = hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert sign(body, b"k") == f"sha256={expected}"
    assert verify(body, b"k", sign(body, b"k"))
    assert not verify(body, b"other", sign(body, b"k"))
    assert not verify(body.replace(b"car", b"cat"), b"k", sign(body, b"k"))
    assert [e["id"] for e in json.loads(body)["events"]] == ["ab12:41:2", "ab12:8:2"]


@pytest.mark.parametrize(
    ("status", "retry"),
    [(500, True), (502, True), (503, True), (408, True), (429, True)]
    # a rotated token, a receiver being redeployed, a moved URL: away, the events wait
    + [(401, True), (403, True), (404, True), (301, True)]
    # the receiver refuses the content (413: split, then refused alone)
    + [(400, False), (410, False), (413, False), (422, False)],
)
def test_webhook_answers_that_are_tried_again(status: int, retry: bool):
    assert is_retryable(status) is retry


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, None), ("", None), ("7", 7.0), ("soon", None), ("Thu, 01 Jan 1970 00:01:40 GMT", 40)],
)
def test_retry_after(header: str | None, seconds: float | None):
    assert retry_after_s(header, now=60.0) == seconds


def test_the_webhook_secret_comes_from_config_or_a_named_variable():
    assert secret_of(WebhookOptions(url="http://h")) is None
    assert secret_of(WebhookOptions(url="http://h", secret="s")) == b"s"
    from_env = WebhookOptions(url="http://h", secret_env="HOOK_SECRET")
    assert secret_of(from_env, {"HOOK_SECRET": "e"}) == b"e"
    with pytest.raises(OutputError, match="'HOOK_SECRET' \\(secret_env\\) is not set"):
        secret_of(from_env, {})


@pytest.mark.parametrize(
    ("attempt", "step"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 10.0), (100, 10.0)],
)
def test_backoff_doubles_up_to_its_cap_with_jitter(attempt: int, step: float):
    def highest(low: float, high: float) -> float:
        return high

    def lowest(low: float, high: float) -> float:
        return low

    assert backoff_delay(attempt, base_s=0.5, max_s=10, rand=highest) == step
    assert backoff_delay(attempt, base_s=0.5, max_s=10, rand=lowest) == step / 2
    assert step / 2 <= backoff_delay(attempt, base_s=0.5, max_s=10) <= step


def test_claim_idle_must_outlast_one_delivery():
    """Else another process takes events over while they are being delivered: named."""
    with pytest.raises(ValueError, match=r"claim_idle_s \(30\) must be longer .* \(70 s"):
        WebhookOptions(url="http://x/h", claim_idle_s=30)  # 4 tries x 10 s + 3 waits x 10 s
    quick = dict(timeout_s=1, retries=1, backoff_max_s=1)
    assert WebhookOptions(url="http://x/h", claim_idle_s=5, **quick).claim_idle_s == 5
    with pytest.raises(ValueError, match="claim_idle_s"):
        MqttOptions(url="mqtt://h", claim_idle_s=5, publish_timeout_s=10)


class FakeServerInfo:
    """``INFO server`` of a Redis of some version (single, or a cluster: one per node)."""

    def __init__(self, version: str, *, cluster: bool = False):
        self._info = {"redis_version": version}
        self._cluster = cluster

    def info(self, section: str) -> dict:
        return {"127.0.0.1:7000": self._info} if self._cluster else self._info


@pytest.mark.parametrize("cluster", [False, True])
def test_outputs_refuse_a_redis_older_than_7_at_start(cluster: bool):
    with pytest.raises(BadInput, match=r"need Redis 7\.0 or later .* this Redis is 6\.2\.14"):
        _check_redis_version(FakeServerInfo("6.2.14", cluster=cluster))
    _check_redis_version(FakeServerInfo("7.0.15", cluster=cluster))
