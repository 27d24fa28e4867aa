"""The Redis ACL rules per role that ``docs/operations.md`` ("Redis users (ACL)") documents;
tests run the workers, and each Lua script they send, under users with exactly these."""

from __future__ import annotations

#: the daemon (``framebatch run``: decoders and batcher)
DAEMON_RULES = (
    "+ping +time +xadd +xlen +xrange +xrevrange +xread +xgroup|create +xreadgroup +xpending "
    "+xclaim +xack +xdel +del +hset +hgetall +multi +exec"
).split()
#: what a detector worker's leases and fenced writes add (``framebatch detect``)
DETECT_RULES = (
    "+evalsha +script|load +eval +zadd +zrange +zremrangebyscore +zrem +zscore +get +set +pexpire "
    "+hget"
).split()
#: what a decode worker's fence adds to the detector worker's rules (a frame's WATCH/MULTI)
DECODE_RULES = [*DETECT_RULES, "+watch"]
#: what the camera registry adds on a shared Redis (run, decode, detect)
REGISTRY_RULES = (
    "+evalsha +script|load +eval +get +hget +hmget +hdel +incr +sadd +srem +sismember +smismember"
).split()
#: what analytics on any camera adds (its state, events and acknowledgement: one script)
ANALYTICS_RULES = "+evalsha +script|load +eval +get +set".split()
