"""``streams.groups.all_read`` on a real redis-server: a stream read to its end by its group,
by Redis 7's lag, and by the last id delivered where the lag cannot be known."""

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
