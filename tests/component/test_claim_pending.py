"""Claiming what other consumers left pending on many streams at once (a detector worker taking
over hundreds of cameras), on a real redis-server: the same answers as one stream at a time."""

from __future__ import annotations

import redis

from streams import groups
from streams.groups import FRAMES_GROUP, claim_pending_each


def read_by(client: redis.Redis, key: str, consumer: str, count: int) -> list[bytes]:
    ids = [client.xadd(key, {"seq": str(n)}) for n in range(count)]
    client.xreadgroup(FRAMES_GROUP, consumer, {key: ">"})
    return ids


def test_each_stream_is_claimed_counted_and_its_trimmed_entries_told(
    redis_client, prefix, monkeypatch
):
    monkeypatch.setattr(groups, "CLAIM_PAGE", 3)  # "long" goes on alone, page by page
    keys = {name: f"{prefix}:frames:{{{name}}}" for name in ("old", "mine", "long", "none")}
    for name in ("old", "mine", "long"):
        redis_client.xgroup_create(keys[name], FRAMES_GROUP, id="0", mkstream=True)
    old = read_by(redis_client, keys["old"], "w1", 3)
    redis_client.xdel(keys["old"], old[0])  # read by w1, then trimmed: lost with it
    read_by(redis_client, keys["mine"], "w2", 2)  # this worker's own already
    read_by(redis_client, keys["long"], "w1", 7)
    claims = claim_pending_each(redis_client, list(keys.values()), "w2")
    assert claims[keys["old"]] == (2, 1)
    assert claims[keys["mine"]] == (0, 0)
    assert claims[keys["long"]] == (7, 0)
    assert "NOGROUP" in str(claims[keys["none"]])
    for name in ("old", "mine", "long"):
        consumers = redis_client.xpending(keys[name], FRAMES_GROUP)["consumers"]
        assert [c["name"] for c in consumers] == [b"w2"]
