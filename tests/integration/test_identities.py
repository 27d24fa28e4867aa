"""Stable identities on a real redis-server: frame ids survive restarts, consumers de-duplicate,
and what an earlier run left (pending on any consumer, or unread) is claimed and counted."""

from __future__ import annotations

import time

import numpy as np
import pytest

from framebatch_tools.audit import audit
from streams.consumer import DetectionConsumer
from streams.keys import FRAMES_GROUP, StreamKeys
from streams.messages import DetectionMessage, EndOfStream, FrameMessage, LedgerEntry, Timestamps
from tests.conftest import MODEL, VIDEOS
from tests.integration.runner import CliResult, published, run_until_done, write_config

pytestmark = pytest.mark.integration

STREET = VIDEOS / "street_night_1920x1080_3fps.mp4"  # 8 frames


def detection(camera: str, session: str, seq: int) -> DetectionMessage:
    stamps = Timestamps(1.0, 1.0, 1.0, 1.0, 1.0)
    return DetectionMessage(camera, seq, None, 4, 4, 0, 1, (), stamps, session=session)


@pytest.mark.parametrize("group", [None, "audit"])
def test_the_consumer_skips_a_republished_frame(redis_client, prefix, group):
    keys = StreamKeys(prefix)
    # session A republished 1 and 2 after a crash; B is a restarted decoder (seq from 0 again)
    sent = [("A", 0), ("A", 1), ("A", 2), ("A", 1), ("A", 2), ("A", 3), ("B", 0), ("B", 1)]
    for session, seq in sent:
        redis_client.xadd(keys.detections("door"), detection("door", session, seq).to_fields())
    consumer = DetectionConsumer(redis_client, keys, from_start=True, group=group)
    got = [m.frame_id for m in consumer.messages(timeout_s=1.0)]
    assert got == ["A:0", "A:1", "A:2", "A:3", "B:0", "B:1"]
    assert consumer.duplicates == 2
    if group is not None:  # repeats are acknowledged too
        assert redis_client.xpending(keys.detections("door"), group)["pending"] == 0
    keep = DetectionConsumer(redis_client, keys, from_start=True, dedupe=False)
    assert len(list(keep.messages(timeout_s=1.0))) == len(sent)


def replay_street(redis_url: str, prefix: str, tmp_path) -> CliResult:
    """``framebatch run --until-done`` on the 8-frame street clip; it must exit 0."""
    config = write_config(
        tmp_path / "c.yaml",
        model=MODEL,
        cameras=[{"id": "street", "url": str(STREET)}],
        redis_url=redis_url,
        prefix=prefix,
    )
    result = run_until_done(config, timeout=300)
    assert result.returncode == 0, result.stderr
    return result


def leftover_frame(camera: str, seq: int) -> dict:
    pixels = np.zeros((32, 32, 3), np.uint8).tobytes()
    now = time.time()
    message = FrameMessage(
        camera, seq, None, 32, 32, 1.0, 0, 0, now, now, pixels, 32, 32, session="earlier"
    )
    return message.to_fields()


def test_a_replay_claims_and_counts_what_an_earlier_run_left(
    assets, redis_client, redis_url, prefix, tmp_path
):
    keys = StreamKeys(prefix)
    stream = keys.frames("street")
    redis_client.xgroup_create(stream, FRAMES_GROUP, id="0", mkstream=True)
    for seq in range(5):
        redis_client.xadd(stream, leftover_frame("street", seq))
    # three read by a worker of the earlier run (another name) and never acknowledged
    redis_client.xreadgroup(FRAMES_GROUP, "batcher-7", {stream: ">"}, count=3)
    assert redis_client.xpending(stream, FRAMES_GROUP)["pending"] == 3
    result = replay_street(redis_url, prefix, tmp_path)
    (camera,) = result.summary["cameras"]
    assert camera["previous_run"] == 5  # pending on another consumer, and unread: all counted
    assert (camera["decoded"], camera["processed"], camera["dropped"]) == (8, 8, {})
    assert "(+5 left by an earlier run)" in result.stdout
    assert redis_client.xpending(stream, FRAMES_GROUP)["pending"] == 0
    assert redis_client.xlen(stream) == 0
    messages = published(redis_client, prefix, "street")
    assert [m.seq for m in messages] == list(range(8))
    assert "earlier" not in {m.session for m in messages}  # never processed as this run's
    # the ledger says so too: every frame of both sessions is detected or dropped
    (report,) = audit(redis_client, keys, ["street"])
    assert report.ok, report.line()
    assert (report.sessions, report.frames, report.detected) == (2, 13, 8)
    assert report.dropped == {"previous_run": 5}


def test_the_ledger_of_a_session_cut_short_by_a_crash_is_completed(
    assets, redis_client, redis_url, prefix, tmp_path
):
    """An earlier run published seq 0-2 of a session and died; its stream still holds 6-8
    and the decoder's end entry (10 frames, one more lost in decoding): 3-5 and 9 were
    trimmed meanwhile.  The next run writes all of that into the ledger."""
    keys = StreamKeys(prefix)
    stream = keys.frames("street")
    redis_client.xgroup_create(stream, FRAMES_GROUP, id="0", mkstream=True)
    for seq in range(3):
        redis_client.xadd(
            keys.detections("street"), detection("street", "earlier", seq).to_fields()
        )
    for seq in range(6, 9):
        redis_client.xadd(stream, leftover_frame("street", seq))
    end = EndOfStream("street", 10, "stopped", decode_errors=1, session="earlier")
    redis_client.xadd(stream, end.to_fields())
    result = replay_street(redis_url, prefix, tmp_path)
    (camera,) = result.summary["cameras"]
    assert camera["previous_run"] == 3 + 3 + 1 + 1  # left, trimmed before and after, decoding
    assert (camera["decoded"], camera["processed"], camera["dropped"]) == (8, 8, {})
    (report,) = audit(redis_client, keys, ["street"])
    assert report.ok, report.line()
    assert report.frames == 10 + 1 + 8 and report.detected == 3 + 8
    assert report.dropped == {"overflow": 4, "previous_run": 3, "decode_error": 1}


def test_frames_a_dead_run_held_whose_entries_were_trimmed_are_accounted(
    assets, redis_client, redis_url, prefix, tmp_path
):
    """The earlier run had read seq 3 and 4 and held them when it died; the stream's cap
    trimmed their entries meanwhile, so they come back empty (no session, no seq).  The next
    run finds them as holes in that session's account and writes them as previous_run."""
    keys = StreamKeys(prefix)
    stream = keys.frames("street")
    redis_client.xgroup_create(stream, FRAMES_GROUP, id="0", mkstream=True)
    for seq in (0, 1, 2, 5):
        redis_client.xadd(
            keys.detections("street"), detection("street", "earlier", seq).to_fields()
        )
    dropped = LedgerEntry("street", "earlier", "drop", 6, 2, "overflow")
    redis_client.xadd(keys.ledger("street"), dropped.to_fields())
    for seq in (3, 4):
        redis_client.xadd(stream, leftover_frame("street", seq))
    redis_client.xreadgroup(FRAMES_GROUP, "batcher-9", {stream: ">"}, count=2)
    redis_client.xtrim(stream, maxlen=0)  # trimmed while pending: the PEL keeps bare ids
    assert redis_client.xpending(stream, FRAMES_GROUP)["pending"] == 2
    result = replay_street(redis_url, prefix, tmp_path)
    assert result.summary["cameras"][0]["previous_run"] == 2
    (report,) = audit(redis_client, keys, ["street"])
    assert report.ok, report.line()
    assert (report.frames, report.detected) == (8 + 8, 4 + 8)
    assert report.dropped == {"overflow": 2, "previous_run": 2}
