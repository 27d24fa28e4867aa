"""Consumer groups of the streams: made once, their pending entries listed and claimed in pages.

Every reader of a stream through a group goes through these: the batcher's frames group
(``FRAMES_GROUP``), the run after a crash and ``framebatch drain`` (what an earlier run left
pending), a detector worker taking a camera over, and ``framebatch consume --group``.
XCLAIM moves ownership only (``justid``) where the pixels are not needed: a frame is ~1 MB.
"""

from __future__ import annotations

import redis

from streams.keys import FRAMES_GROUP

CLAIM_PAGE = 1000  # pending entries looked at per XPENDING


def ensure_group(
    client: redis.Redis, key: str, group: str = FRAMES_GROUP, *, start: str = "0"
) -> None:
    """The group on ``key`` (the stream made if missing), reading from ``start`` ("0": every
    entry, "$": only new ones); a group that exists keeps its position and pending entries."""
    try:
        client.xgroup_create(key, group, id=start, mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def all_read(client: redis.Redis, key: str, group: str = FRAMES_GROUP) -> bool:
    """Every entry of the stream delivered to the group and acknowledged: a stream nothing
    more is written to has been read to its end.  Said by the last id delivered being the
    stream's last (a group delivers in id order), not by Redis 7's lag: the group's count of
    entries read behind it can be wrong after Redis restarts from its append-only file (a
    stream read to its end showed lag 57, and its camera was never retired)."""
    for info in client.xinfo_groups(key):
        if _text(info["name"]) != group:
            continue
        if info["pending"]:
            return False
        last = client.xinfo_stream(key)["last-generated-id"]
        return _stream_id(info["last-delivered-id"]) >= _stream_id(last)
    return False


def _stream_id(value: bytes | str) -> tuple[int, int]:
    milliseconds, _, sequence = _text(value).partition("-")
    return int(milliseconds), int(sequence or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def pending_ids(client: redis.Redis, key: str, group: str = FRAMES_GROUP) -> set[bytes]:
    """Every entry of the group read and not acknowledged, by any consumer."""
    ids: set[bytes] = set()
    after: str | bytes = "-"
    while page := client.xpending_range(key, group, min=after, max="+", count=CLAIM_PAGE):
        ids.update(p["message_id"] for p in page)
        after = b"(" + page[-1]["message_id"]  # exclusive: the next page
    return ids


def pending_between(
    client: redis.Redis,
    key: str,
    *,
    after: str | bytes,
    before: str | bytes | None,
    count: int = CLAIM_PAGE,
    group: str = FRAMES_GROUP,
) -> list[bytes]:
    """Ids of the entries pending on any consumer strictly between two entry ids
    (``before=None``: every one after ``after``)."""
    low = b"(" + (after.encode() if isinstance(after, str) else after)
    high = (
        b"+" if before is None else b"(" + (before.encode() if isinstance(before, str) else before)
    )
    return [p["message_id"] for p in client.xpending_range(key, group, low, high, count)]


def claim(
    client: redis.Redis,
    key: str,
    consumer: str,
    ids: list[bytes],
    *,
    group: str = FRAMES_GROUP,
) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
    """Take these pending entries over, with their fields.  An entry trimmed from the stream
    meanwhile is dropped from the group and not returned (Redis 7), or returned without
    fields (older servers): callers take a missing one as a frame lost with its reader."""
    return client.xclaim(key, group, consumer, 0, ids)


def claim_pending(
    client: redis.Redis, key: str, consumer: str, group: str = FRAMES_GROUP
) -> tuple[int, int]:
    """Take over the entries other consumers of the group read and never acknowledged (a
    worker that crashed, or had another name): ownership only.  Returns (claimed, trimmed):
    XCLAIM drops from the group the entries the stream no longer holds, and those are frames
    their reader held when it stopped.  Raises ResponseError NOGROUP when the group is gone."""
    claimed, trimmed, after, mine = 0, 0, "-", consumer.encode()
    while pending := client.xpending_range(key, group, min=after, max="+", count=CLAIM_PAGE):
        ids = [p["message_id"] for p in pending if p["consumer"] != mine]
        if ids:
            taken = client.xclaim(key, group, consumer, 0, ids, justid=True)
            claimed += len(taken)
            trimmed += len(ids) - len(taken)
        after = b"(" + pending[-1]["message_id"]
    return claimed, trimmed


def claim_pending_each(
    client: redis.Redis, keys: list[str], consumer: str, group: str = FRAMES_GROUP
) -> dict[str, tuple[int, int] | redis.ResponseError]:
    """:func:`claim_pending` for many streams, in two pipelines (a round trip per node on a
    cluster) rather than two round trips a stream: a detector worker taking over a lost one's
    hundreds of cameras.  A stream with a full page pending goes on alone; one whose group is
    gone answers with its NOGROUP error."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.xpending_range(key, group, min="-", max="+", count=CLAIM_PAGE)
    results: dict[str, tuple[int, int] | redis.ResponseError] = {}
    others: dict[str, list[bytes]] = {}
    longer: list[str] = []
    mine = consumer.encode()
    for key, page in zip(keys, pipe.execute(raise_on_error=False) if keys else [], strict=True):
        if isinstance(page, redis.ResponseError):
            results[key] = page
        elif isinstance(page, Exception):
            raise page
        elif len(page) >= CLAIM_PAGE:
            longer.append(key)
        else:
            results[key] = (0, 0)
            ids = [p["message_id"] for p in page if p["consumer"] != mine]
            if ids:
                others[key] = ids
    pipe = client.pipeline(transaction=False)
    for key, ids in others.items():
        pipe.xclaim(key, group, consumer, 0, ids, justid=True)
    taken_each = pipe.execute(raise_on_error=False) if others else []
    for (key, ids), taken in zip(others.items(), taken_each, strict=True):
        if isinstance(taken, redis.ResponseError):
            results[key] = taken
        elif isinstance(taken, Exception):
            raise taken
        else:
            results[key] = (len(taken), len(ids) - len(taken))
    for key in longer:
        try:
            results[key] = claim_pending(client, key, consumer, group)
        except redis.ResponseError as exc:
            results[key] = exc
    return results
