"""Every fenced write's Lua script runs under a Redis user with exactly the rules that
``docs/operations.md`` documents for the role that sends it, on a real redis-server.

A script's commands are checked by the ACL one by one as the script runs them, and the
analytics script is not probed at a worker's start: a command missing from the documented
rules shows only here, or at a user's first analysed batch."""

from __future__ import annotations

import re

import pytest
import redis

from pipeline.ledger.acks import AnalyticsWrite, FrameAcks, StreamAck, kept_state
from streams.keys import FRAMES_GROUP
from streams.messages import CameraPosition, LedgerEntry
from tests.acl_rules import (
    ANALYTICS_RULES,
    DAEMON_RULES,
    DETECT_RULES,
    REGISTRY_RULES,
)
from tests.conftest import REPO_ROOT

#: the table's rows, by the first words of their role (docs/operations.md)
DOCUMENTED = {
    "daemon": DAEMON_RULES,
    "detector worker": DETECT_RULES,
    "decode worker": ["+watch"],
    "the camera registry": REGISTRY_RULES,
    "with `analytics`": ANALYTICS_RULES,
}


@pytest.mark.parametrize("role", DOCUMENTED)
def test_the_rules_tested_are_the_ones_documented(role):
    table = (REPO_ROOT / "docs" / "operations.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith(f"| {role}"))
    granted = set(re.findall(r"\+[a-z]+(?:\\?\|[a-z]+)?", row.split("|", 2)[2]))
    assert {rule.replace("|", "\\|") for rule in DOCUMENTED[role]} <= granted, row


@pytest.fixture
def as_user(redis_url, acl_user, prefix):
    """A client of a new user with the given rules on the test's prefix only."""
    clients = []

    def connect(*rules: str) -> redis.Redis:
        user, password = acl_user(f"~{prefix}:*", *rules)
        client = redis.Redis.from_url(redis_url, username=user, password=password)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


@pytest.fixture
def pending(redis_client, gate_pending):
    """Camera ``gate``'s two frames read by worker w1, which holds its lease."""
    keys, _frames, _ids = gate_pending
    redis_client.set(keys.lease("gate"), "w1")
    return gate_pending


def overflow(first_seq: int) -> LedgerEntry:
    return LedgerEntry("gate", "s1", "drop", first_seq, 1, "overflow", 1000.0)


def test_a_detector_worker_keeps_positions_and_acknowledges_with_its_documented_rules(
    redis_client, as_user, pending
):
    """Only ``framebatch detect`` runs these scripts (a decode worker's fence is its own,
    run under its documented rules by test_bad_input.py's decode worker)."""
    keys, frames, ids = pending
    client = as_user(*DAEMON_RULES, *DETECT_RULES)
    acks = FrameAcks(redis_client=client, keys=keys, ledger_maxlen=100, lease_holder="w1")
    tx = acks.transactions()
    acks.record_position(tx, "gate", CameraPosition("s1", 0, entry_id=ids[0].decode()))
    tx.execute()
    position = CameraPosition("s1", 2, entry_id=ids[1].decode())
    assert acks.acknowledge_streams([StreamAck(frames, ids, [overflow(2)], position)]) == set()
    # XACK and XDEL run in pcall, which swallows a denial: what they did is looked at
    assert redis_client.xpending(frames, FRAMES_GROUP)["pending"] == 0
    assert redis_client.xlen(frames) == 0
    assert redis_client.hget(keys.cursor("gate"), "entry_id") == ids[1]
    assert redis_client.xlen(keys.ledger("gate")) == 1


@pytest.mark.parametrize(
    ("rules", "holder"),
    [
        ([*DAEMON_RULES, *DETECT_RULES, *ANALYTICS_RULES], "w1"),
        ([*DAEMON_RULES, *ANALYTICS_RULES], None),
    ],
    ids=["detect", "run-until-done"],
)
def test_analytics_write_state_events_and_acknowledgement_with_the_documented_rules(
    redis_client, as_user, pending, rules, holder
):
    keys, frames, ids = pending
    client = as_user(*rules)
    acks = FrameAcks(redis_client=client, keys=keys, ledger_maxlen=100, lease_holder=holder)
    event = {"kind": "line_cross", "camera": "gate"}
    first = acks.acknowledge_frames({frames: ids[1:]}, {"gate": AnalyticsWrite([event], b"s2")})
    # then a state of an older frame: the script reads the kept one's stream id (GET)
    older = acks.acknowledge_frames({frames: ids[:1]}, {"gate": AnalyticsWrite([], b"s1")})
    assert (first.refused, first.superseded, older.refused) == (set(), set(), set())
    assert older.superseded == {"gate"}
    assert kept_state(redis_client.get(keys.analytics_state("gate"))) == b"s2"
    assert redis_client.xlen(keys.object_events("gate")) == 1
    assert redis_client.xpending(frames, FRAMES_GROUP)["pending"] == 0
    assert redis_client.xlen(frames) == 0


def test_without_the_analytics_rules_the_script_is_refused_by_name(as_user, pending):
    """The check above can fail: the daemon's rules alone do not run the analytics script."""
    keys, frames, ids = pending
    acks = FrameAcks(redis_client=as_user(*DAEMON_RULES), keys=keys, ledger_maxlen=100)
    with pytest.raises(redis.exceptions.NoPermissionError, match="(?i)eval"):
        acks.acknowledge_frames({frames: ids}, {"gate": AnalyticsWrite([], b"s")})
