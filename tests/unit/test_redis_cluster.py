"""Pure logic of the Redis Cluster support: hash tags, per-slot transactions, the local key
parser for stream reads.  The real cluster runs in tests/integration/test_redis_cluster.py."""

from __future__ import annotations

import pytest
from redis.cluster import key_slot

from streams.keys import StreamKeys
from streams.redis_cluster import SlotTransactions, _StreamKeysParser, hash_tag


@pytest.mark.parametrize(
    ("key", "tag"),
    [
        ("fb:frames:{door}", "door"),
        ("fb:events", "fb:events"),
        ("fb:probe:{ab}:hash", "ab"),
        ("a{}b", "a{}b"),  # an empty tag hashes the whole key, as Redis does
        ("a{x}{y}", "x"),  # the first one counts
    ],
)
def test_hash_tag_is_what_redis_cluster_hashes(key, tag):
    assert hash_tag(key) == tag
    assert key_slot(key.encode()) == key_slot(tag.encode())


def test_every_key_of_a_camera_is_in_its_slot_and_cameras_differ():
    keys = StreamKeys("fb")
    per_camera = (keys.frames, keys.detections, keys.ledger, keys.progress, keys.lease)
    for camera in ("door", "yard", "a.b-c_1"):
        assert {key_slot(make(camera).encode()) for make in (*per_camera, keys.cursor)} == {
            key_slot(camera.encode())
        }
        assert keys.camera_from_detections(keys.detections(camera).encode()) == camera
    assert key_slot(b"door") != key_slot(b"yard")


class FakePipeline:
    def __init__(self, log: list):
        self.commands: list[tuple] = []
        self._log = log

    def xadd(self, key, fields):
        self.commands.append(("XADD", key))

    def execute(self, raise_on_error=True):
        self._log.append(self)
        return [f"{c[0]} {c[1]}" for c in self.commands]


class FakeClient:
    def __init__(self):
        self.executed: list[FakePipeline] = []

    def pipeline(self, transaction):
        pipe = FakePipeline(self.executed)
        pipe.transaction = transaction
        return pipe


class FakeClusterClient(FakeClient):
    pass


def test_one_transaction_on_a_single_redis_one_per_camera_on_a_cluster(monkeypatch):
    keys = StreamKeys("fb")
    writes = [keys.ledger("a"), keys.frames("b"), keys.frames("a"), keys.detections("b")]
    single = FakeClient()
    tx = SlotTransactions(single)
    for key in writes:
        tx.on(key).xadd(key, {})
    assert tx.execute() == [f"XADD {k}" for k in writes]
    assert [len(p.commands) for p in single.executed] == [4]

    monkeypatch.setattr("streams.redis_cluster.RedisCluster", FakeClusterClient)
    cluster = FakeClusterClient()
    tx = SlotTransactions(cluster)
    for key in writes:
        tx.on(key).xadd(key, {})
    # each camera's writes in order, in their own transaction
    assert tx.execute() == [f"XADD {k}" for k in (writes[0], writes[2], writes[1], writes[3])]
    assert [[c[1] for c in p.commands] for p in cluster.executed] == [
        [writes[0], writes[2]],
        [writes[1], writes[3]],
    ]
    assert all(p.transaction for p in [*single.executed, *cluster.executed])


def test_writes_that_stand_alone_share_one_plain_pipeline_on_a_cluster(monkeypatch):
    keys = StreamKeys("fb")
    writes = [keys.detections(c) for c in ("a", "b", "a", "c")]
    monkeypatch.setattr("streams.redis_cluster.RedisCluster", FakeClusterClient)
    for client, transaction in ((FakeClient(), True), (FakeClusterClient(), False)):
        tx = SlotTransactions(client, atomic=False)
        for key in writes:
            tx.on(key).xadd(key, {})
        assert tx.execute() == [f"XADD {k}" for k in writes]  # in the order written
        assert [p.transaction for p in client.executed] == [transaction]


@pytest.mark.parametrize(
    "args",
    [
        ("XREADGROUP", b"GROUP", "g", "c", b"COUNT", 4, b"STREAMS", "k1", "k2", ">", ">"),
        ("XREAD", "COUNT", 1, "BLOCK", 5, "STREAMS", "k1", "k2", "0", "0"),
        ("EVAL", "return 1", 2, "k1", "k2", "arg"),
        # a group and a consumer may be called "streams"
        ("XREADGROUP", "GROUP", "streams", "STREAMS", "STREAMS", "k1", "k2", ">", ">"),
    ],
)
def test_the_keys_of_reads_and_scripts_are_found_without_asking_redis(args):
    parser = object.__new__(_StreamKeysParser)  # no command table needed for these
    assert parser.get_keys(None, *args) == ["k1", "k2"]
