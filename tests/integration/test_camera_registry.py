"""The camera registry on a real redis-server (and a real Redis Cluster): adds, changes and
removals checked against what the writer read, the loser of a race told; the config's seeding;
a follower that sees every change, a missed one too, and one it could not apply again."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import redis

from framebatch_tools.local_cluster import LocalRedisCluster
from pipeline.config import CameraConfig, load_config
from pipeline.fleet.registry import (
    CameraRegistry,
    RegistryConflict,
    RegistryFollower,
    differing,
    entry_json,
)
from streams.keys import StreamKeys
from streams.redis_connect import connect
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


def camera(camera_id: str, **settings) -> CameraConfig:
    return CameraConfig.model_validate({"id": camera_id, "url": "rtsp://cam/1", **settings})


@pytest.fixture
def registry(redis_client: redis.Redis, prefix: str) -> CameraRegistry:
    return CameraRegistry(redis_client, StreamKeys(prefix))


def test_an_add_a_change_and_a_removal_each_check_what_the_writer_read(registry):
    first = registry.add(camera("door"))
    with pytest.raises(RegistryConflict, match="camera id 'door' is in use") as taken:
        registry.add(camera("door", priority=2))
    assert taken.value.version == first

    second = registry.change(camera("door", priority=3), expected=first)
    assert second > first and registry.get("door").config.priority == 3
    with pytest.raises(RegistryConflict, match=f"changed since version {first}") as stale:
        registry.change(camera("door", priority=5), expected=first)
    assert stale.value.version == second
    with pytest.raises(RegistryConflict, match="changed since"):
        registry.remove("door", expected=first)

    removing = registry.remove("door", expected=second)
    assert registry.get("door") == registry.cameras()["door"]
    assert registry.get("door").removing and registry.get("door").version == removing
    for refused in (
        lambda: registry.add(camera("door")),
        lambda: registry.change(camera("door", priority=1), expected=removing),
        lambda: registry.remove("door"),
    ):
        with pytest.raises(RegistryConflict, match="'door' is being removed"):
            refused()
    registry.retire("door")  # drained by whoever ran it
    assert registry.get("door") is None and registry.cameras() == {}
    with pytest.raises(RegistryConflict, match="'door' is not in the registry"):
        registry.remove("door")
    with pytest.raises(RegistryConflict, match="not in the registry"):
        registry.change(camera("door"), expected=second)
    registry.add(camera("door"))  # the id is free again


def race(registry: CameraRegistry, expected: int, writers: int = 4) -> list[object]:
    """``writers`` threads changing "gate" at once, each from version ``expected``: what each
    got (its new version, or the conflict)."""
    outcomes: list[object] = []
    start = threading.Barrier(writers)

    def change(priority: int) -> None:
        start.wait()
        try:
            outcomes.append(registry.change(camera("gate", priority=priority), expected))
        except RegistryConflict as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=change, args=(p,)) for p in range(1, writers + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_of_writers_racing_on_one_version_exactly_one_wins(registry):
    version = registry.add(camera("gate"))
    for round_ in range(20):
        outcomes = race(registry, version)
        won = [o for o in outcomes if isinstance(o, int)]
        assert len(won) == 1, f"round {round_}: {outcomes}"
        lost = [o for o in outcomes if isinstance(o, RegistryConflict)]
        assert {exc.version for exc in lost} == set(won)
        version = won[0]


def test_seeding_keeps_what_an_api_added_and_changes_only_what_differs(registry):
    registry.seed([camera("a"), camera("b", priority=1)])
    before = registry.version()
    registry.seed([camera("a"), camera("b", priority=1)])  # a restart: nothing changed
    assert registry.version() == before
    registry.add(camera("added-live"))
    registry.remove("a")  # a removal not drained yet: left to it
    registry.seed([camera("a", priority=2), camera("b", priority=4)])  # the config edited
    assert {c: (e.config.priority, e.removing) for c, e in registry.cameras().items()} == {
        "a": (0, True),
        "b": (4, False),
        "added-live": (0, False),
    }


def test_a_follower_sees_every_change_and_again_what_it_did_not_apply(registry):
    registry.seed([camera("a"), camera("b")])
    follower = RegistryFollower(registry)
    first = follower.changes()
    assert sorted(c.config.id for c in first.added) == ["a", "b"]
    for entry in first.added:
        follower.applied(entry.config.id, entry.version)
    assert not follower.changes()

    # changes made while the follower did not look: seen as they are now
    registry.add(camera("c"))
    b_now = registry.get("b")
    registry.change(camera("b", max_fps=2.0), expected=b_now.version)
    registry.remove("a")
    seen = follower.changes()
    assert [c.config.id for c in seen.added] == ["c"]
    assert [(c.config.id, c.config.max_fps) for c in seen.changed] == [("b", 2.0)]
    assert differing(b_now.config, seen.changed[0].config) == {"max_fps"}
    assert [c.config.id for c in seen.removing] == ["a"] and not seen.retired

    # "c" could not be added yet (its id still draining, say): it comes again, alone
    follower.applied("b", seen.changed[0].version)
    follower.applied("a", seen.removing[0].version)
    again = follower.changes()
    assert [c.config.id for c in again.added] == ["c"] and not again.changed
    follower.applied("c", again.added[0].version)
    assert not follower.changes()

    registry.retire("a")  # drained where it ran
    assert follower.changes().retired == ("a",)
    follower.forgot("a")
    assert not follower.changes()


def test_a_camera_retired_and_added_back_between_two_looks_is_retired_then_added(registry):
    """A removal ends only in a retirement: a follower that saw "a" being removed and next
    finds it registered again must drop what it ran (its decoder stopped for good) before it
    runs the new entry, or it would keep "a" as being removed for ever."""
    registry.seed([camera("a")])
    follower = RegistryFollower(registry)
    follower.applied("a", follower.changes().added[0].version)
    registry.remove("a")
    removing = follower.changes().removing
    assert [e.config.id for e in removing] == ["a"]
    follower.applied("a", removing[0].version)
    registry.retire("a")
    registry.add(camera("a", max_fps=3.0))  # within one look
    seen = follower.changes()
    assert seen.retired == ("a",) and not seen.added and not seen.changed
    follower.forgot("a")
    back = follower.changes()
    assert [(e.config.id, e.config.max_fps) for e in back.added] == [("a", 3.0)]
    follower.applied("a", back.added[0].version)
    assert not follower.changes()


def test_an_entry_this_version_cannot_read_is_left_out_and_said(
    registry, redis_client, prefix, caplog
):
    registry.add(camera("fine"))
    base = f"{prefix}:registry:{{cameras}}"
    redis_client.hset(base, "odd", '{"id": "odd", "url": "ftp://x"}')
    redis_client.hset(f"{base}:versions", "odd", 99)
    with caplog.at_level(logging.WARNING):
        assert list(registry.cameras()) == ["fine"]
    assert "camera odd: registry entry not valid here, left out" in caplog.text


@pytest.mark.parametrize("config", sorted((REPO_ROOT / "configs").glob("*.yaml")))
def test_every_camera_of_the_shipped_configs_reads_back_the_same(config: Path):
    environ = {"CAM_USER": "admin", "CAM_PASSWORD": "p@ss:word", "REDIS_PASSWORD": "x"}
    for entry in load_config(config, environ=environ).cameras:
        back = CameraConfig.model_validate_json(entry_json(entry))
        assert back == entry


def test_the_registry_on_a_cluster_is_one_slot():
    with LocalRedisCluster() as cluster:
        client = connect(cluster.url, cluster=True)
        try:
            registry = CameraRegistry(client, StreamKeys("fleet"))
            version = registry.add(camera("door"))
            registry.change(camera("door", priority=1), expected=version)
            follower = RegistryFollower(registry)
            assert [c.config.priority for c in follower.changes().added] == [1]
        finally:
            client.close()
