"""The NATS JetStream output against a real nats-server (JetStream on, file storage, a password)
on loopback, fed by the outputs relay from a real redis-server: every event stored once in the
stream, through a repeated batch and a server restart; a refused password and a stream that may
not be created are one line at start."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pipeline.errors import BadInput
from pipeline.supervisor.outputs import OutputsPart
from streams.embedded_redis import free_tcp_port
from streams.keys import StreamKeys
from streams.outputs import nats as nats_output
from streams.outputs.base import OutputError
from streams.outputs.relay import OutputRelay
from tests.integration.servers import LoopbackServer
from tests.integration.test_outputs import (
    events_of,
    ids,
    relay_of,
    wait_for,
    write,
)

pytestmark = pytest.mark.integration

nats = pytest.importorskip("nats", reason="nats-py is not installed")

NATS_SERVER = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/sbin")


class NatsServer(LoopbackServer):
    """nats-server with JetStream and a password, its store in the folder (a restart keeps the
    stream)."""

    name = "nats-server"

    def __init__(self, folder: Path, user: str = "relay", password: str = "s3cret"):
        super().__init__(folder)
        self.user, self.password = user, password

    def command(self) -> list[str]:
        return [NATS_SERVER, "-js", "-sd", str(self.folder / "store"), "-a", "127.0.0.1"] + [
            "-p", str(self.port), "--user", self.user, "--pass", self.password,
        ]  # fmt: skip

    def url(self, password: str | None = None) -> str:
        return f"nats://{self.user}:{password or self.password}@127.0.0.1:{self.port}"

    def stored(self, stream: str = "FRAMEBATCH") -> list[tuple[str, str, bytes]]:
        """What the stream holds, in order: (subject, Nats-Msg-Id, payload) per message."""

        async def read() -> list[tuple[str, str, bytes]]:
            client = await nats.connect(self.url(), connect_timeout=5)
            try:
                js = client.jetstream()
                info = await js.stream_info(stream)
                messages = []
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    message = await js.get_msg(stream, seq)
                    msg_id = (message.headers or {}).get(nats_output.MSG_ID_HEADER, "")
                    messages.append((message.subject, msg_id, message.data))
                return messages
            finally:
                await client.close()

        return asyncio.run(read())


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    if NATS_SERVER is None:
        pytest.skip("nats-server is not installed (apt-get install nats-server)")
    running = NatsServer(tmp_path)
    running.start()
    yield running
    running.stop()


def test_jetstream_stores_every_event_once_even_when_a_batch_comes_again(
    redis_client: redis.Redis, prefix: str, server: NatsServer, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    options = nats_output.Options(url=server.url(), subject_prefix=prefix, batch_size=7)
    relay = relay_of(relays, redis_client, keys, lambda: ["door", "yard"], options)
    written = events_of("door", range(1, 21)) + events_of("yard", range(1, 11))
    write(redis_client, keys, written)
    wait_for(lambda: relay.stats()["nats"].delivered == 30, "30 events acknowledged")

    # what a relay killed before its acknowledgement does: the same events again
    again = nats_output.open_output(options)
    try:
        again.deliver(written[:12])
    finally:
        again.close()

    stored = server.stored()
    stored_ids = [msg_id for _, msg_id, _ in stored]
    assert sorted(stored_ids) == sorted(e.id for e in written)  # each once
    for camera in ("door", "yard"):  # each camera's in its order (cameras interleave)
        camera_ids = [i for i in stored_ids if f"-{camera}:" in i]
        assert camera_ids == [e.id for e in written if e.camera == camera]
    by_id = {e.id: e for e in written}
    for subject, msg_id, payload in stored:  # each on its camera's and kind's subject
        event = by_id[msg_id]
        assert subject == f"{prefix}.events.{event.camera}.{event.kind}"
        assert f'"id":"{msg_id}"' in payload.decode()
    stats = relay.stats()["nats"]
    assert (dict(stats.dropped), stats.failing, stats.backlog) == ({}, False, 0)


def test_jetstream_server_restarted_mid_run_loses_nothing(
    redis_client: redis.Redis, prefix: str, server: NatsServer, relays: list[OutputRelay]
):
    keys = StreamKeys(prefix)
    options = nats_output.Options(
        url=server.url(), subject_prefix=prefix, batch_size=5, retry_max_s=0.3,
        publish_timeout_s=2, reconnect_wait_s=0.5,
    )  # fmt: skip
    relay = relay_of(relays, redis_client, keys, lambda: ["door"], options)
    before, during, after = (
        events_of("door", range(a, b)) for a, b in ((1, 11), (11, 21), (21, 31))
    )
    write(redis_client, keys, before)
    wait_for(lambda: relay.stats()["nats"].delivered == 10, "the first events delivered")

    server.stop()
    write(redis_client, keys, during)  # written while the server is down: they wait in Redis
    wait_for(lambda: relay.stats()["nats"].failing, "the relay to see the server gone")
    assert relay.stats()["nats"].delivered == 10
    server.start()
    write(redis_client, keys, after)

    wait_for(lambda: relay.stats()["nats"].delivered >= 30, "every event acknowledged", 30)
    stored = [msg_id for _, msg_id, _ in server.stored()]
    assert sorted(stored) == sorted(ids(before + during + after))  # each once
    stats = relay.stats()["nats"]
    assert not stats.dropped and not stats.failing
    assert stats.last_error is not None and server.password not in stats.last_error


def test_a_refused_password_is_one_clear_line_without_it(
    server: NatsServer, redis_client: redis.Redis
):
    wrong = "not-the-Pa55word"
    options = nats_output.Options(url=server.url(password=wrong))
    with pytest.raises(OutputError) as caught:
        nats_output.open_output(options)
    message = str(caught.value)
    assert "\n" not in message and wrong not in message
    assert f"nats://{server.user}:***@127.0.0.1:{server.port}" in message
    assert "refused the user name or password" in message
    assert wrong not in repr(options)
    with pytest.raises(BadInput) as at_start:
        OutputsPart([options], client=redis_client, keys=StreamKeys("x"), cameras=list)
    assert str(at_start.value) == message


def test_no_stream_and_none_to_be_created_is_one_clear_line(server: NatsServer):
    options = nats_output.Options(url=server.url(), subject_prefix="site1", create_stream=False)
    with pytest.raises(OutputError) as caught:
        nats_output.open_output(options)
    assert str(caught.value) == (
        f"nats output 'nats': no JetStream stream on nats://{server.user}:***@127.0.0.1:"
        f"{server.port} captures site1.> and create_stream is false"
    )


def test_server_down_at_start_is_an_outage_not_bad_input():
    url = f"nats://relay:s3cret@127.0.0.1:{free_tcp_port()}"
    output = nats_output.open_output(nats_output.Options(url=url, connect_timeout_s=2))
    try:
        with pytest.raises(nats_output.OutputUnavailable) as caught:
            output.deliver(events_of("door", range(1, 2)))
        assert "s3cret" not in str(caught.value)
    finally:
        output.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("url", "http://host:4222"), ("subject_prefix", "a.*.b"), ("stream", "has.dot")],
)
def test_bad_settings_name_the_field(field: str, value: str):
    settings = {"url": "nats://127.0.0.1:4222", field: value}
    with pytest.raises(ValueError, match=field):
        nats_output.Options.model_validate(settings)
