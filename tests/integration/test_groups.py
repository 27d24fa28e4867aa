"""``streams.groups.all_read`` on a real redis-server: a stream read to its end by its group,
by the last id delivered, whatever Redis 7's lag says (it cannot be known once a hole was
made inside the stream, and is wrong where the group's read count is, as after a restart from
the append-only file)."""

from __future__ import annotations

import pytest
import redis

from streams.groups import all_read, ensure_group
from streams.keys import FRAMES_GROUP

pytestmark = pytest.mark.integration


def read(client: redis.Redis, key: str, count: int) -> list[bytes]:
    got = client.xreadgroup(FRAMES_GROUP, "c", {key: ">"}, count=count)
    return [entry_id for entry_id, _ in got[0][1]] if got else []


def test_all_read_means_delivered_and_acknowledged(redis_client: redis.Redis, prefix: str):
    key = f"{prefix}:frames:{{cam}}"
    ensure_group(redis_client, key)
    assert all_read(redis_client, key)  # empty
    for n in range(5):
        redis_client.xadd(key, {"n": n})
    assert not all_read(redis_client, key)
    first = read(redis_client, key, 3)
    assert not all_read(redis_client, key)  # two not delivered
    rest = read(redis_client, key, 10)
    assert not all_read(redis_client, key)  # delivered, not acknowledged
    redis_client.xack(key, FRAMES_GROUP, *first, *rest)
    assert all_read(redis_client, key)

    more = [redis_client.xadd(key, {"n": n}) for n in range(5, 8)]
    redis_client.xdel(key, more[1])  # a hole not yet read: Redis cannot tell the lag any more
    assert redis_client.xinfo_groups(key)[0]["lag"] is None
    assert not all_read(redis_client, key)
    redis_client.xack(key, FRAMES_GROUP, *read(redis_client, key, 10))
    assert all_read(redis_client, key)


def test_a_wrong_lag_does_not_hide_a_stream_read_to_its_end(redis_client: redis.Redis, prefix):
    """A group's count of entries read, as a restart from the append-only file can leave it
    (behind the entries it delivered): Redis reports lag, the stream is read all the same."""
    key = f"{prefix}:frames:{{cam}}"
    ensure_group(redis_client, key)
    ids = [redis_client.xadd(key, {"n": n}) for n in range(6)]
    redis_client.xack(key, FRAMES_GROUP, *read(redis_client, key, 10))
    redis_client.execute_command("XGROUP", "SETID", key, FRAMES_GROUP, ids[-1], "ENTRIESREAD", 2)
    assert redis_client.xinfo_groups(key)[0]["lag"] == 4
    assert all_read(redis_client, key)
    redis_client.xadd(key, {"n": 6})
    assert not all_read(redis_client, key)
