"""``framebatch consume``: detections (or, with ``--events``, analytics events) as JSON lines,
from Redis."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUN_FAILED

log = logging.getLogger("framebatch")

REDIS_URL_ENV = "FRAMEBATCH_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def register(commands: Any) -> None:
    consume = commands.add_parser(
        "consume", help="print detections (or analytics events) as JSON lines"
    )
    consume.add_argument(
        "--events",
        action="store_true",
        help="analytics events (track_start/end, zone_enter/exit, line_cross, loiter) "
        "instead of detections",
    )
    consume.add_argument(
        "--redis",
        metavar="URL",
        help=f"Redis URL (default: ${REDIS_URL_ENV}, else {DEFAULT_REDIS_URL}); a password "
        "here shows in ps, so prefer the variable or --redis-file",
    )
    consume.add_argument("--redis-file", metavar="PATH", help="read the Redis URL from a file")
    consume.add_argument(
        "--reconnect-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="once started, ride out a Redis outage this long (default: %(default)s); a Redis "
        "not reached at start is exit 2 at once",
    )
    consume.add_argument(
        "--cluster", action="store_true", help="the URL is a node of a Redis Cluster"
    )
    consume.add_argument(
        "--prefix", default="fb", metavar="PREFIX", help="key prefix (default: %(default)s)"
    )
    consume.add_argument(
        "--camera", action="append", metavar="ID", help="camera id (repeatable; default: all)"
    )
    consume.add_argument(
        "--from-start", action="store_true", help="start at the oldest message kept"
    )
    consume.add_argument("--count", type=int, metavar="N", help="exit after N messages")
    consume.add_argument(
        "--timeout", type=float, metavar="S", help="exit after S seconds with no new message"
    )
    consume.add_argument(
        "--group", metavar="NAME", help="durable consumer group; acknowledges what it printed"
    )
    consume.add_argument(
        "--keep-duplicates",
        action="store_true",
        help="print a frame's detections again when a restart re-published them "
        "(default: skip repeats of a frame_id, or of an event's id)",
    )
    consume.set_defaults(handler=cmd_consume)


def consume_redis_url(args: argparse.Namespace, environ=os.environ) -> str:
    """``--redis``, else ``--redis-file``, else $FRAMEBATCH_REDIS_URL, else the local default.
    A password on the command line is visible to every user in ``ps``: say so."""
    if args.redis:
        from streams.urls import redact_url

        if redact_url(args.redis) != args.redis:
            log.warning(
                "the password in --redis is visible to other users in ps: "
                "use $%s or --redis-file instead",
                REDIS_URL_ENV,
            )
        return args.redis
    if args.redis_file:
        return Path(args.redis_file).read_text().strip()
    return environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL


def probe_redis(url: str, *, cluster: bool) -> None:
    """Reach Redis once with a client that never retries: a refused connection, a wrong
    password or TLS at start raise at once (the long wait is for an outage after a good
    start, as for the daemon)."""
    import redis

    from streams.redis_connect import CONNECT_TIMEOUT_S, connect

    probe = connect(url, reconnect_timeout_s=0, socket_timeout_s=CONNECT_TIMEOUT_S, cluster=cluster)
    try:
        probe.ping()
    except redis.exceptions.NoPermissionError:
        pass  # it answered: an ACL without PING may still read the streams
    finally:
        probe.close()


def cmd_consume(args: argparse.Namespace) -> int:
    import redis

    from streams.consumer import DetectionConsumer, EventConsumer
    from streams.keys import StreamKeys
    from streams.redis_access import describe_redis_error
    from streams.redis_connect import connect
    from streams.redis_errors import is_outage

    url = ""
    try:
        url = consume_redis_url(args)
        probe_redis(url, cluster=args.cluster)
        client = connect(url, reconnect_timeout_s=args.reconnect_timeout, cluster=args.cluster)
    except (OSError, ValueError) as exc:
        print(f"framebatch consume: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except redis.RedisError as exc:  # not reached at start: bad input, not an outage
        print(f"framebatch consume: {describe_redis_error(exc, url)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    consumer = (EventConsumer if args.events else DetectionConsumer)(
        client,
        StreamKeys(args.prefix),
        cameras=args.camera or (),
        from_start=args.from_start,
        group=args.group,
        dedupe=not args.keep_duplicates,
    )
    try:
        for message in consumer.messages(count=args.count, timeout_s=args.timeout):
            print(json.dumps(message.to_json()), flush=True)
    except KeyboardInterrupt:
        pass
    except redis.RedisError as exc:
        print(f"framebatch consume: {describe_redis_error(exc, url)}", file=sys.stderr)
        return EXIT_RUN_FAILED if is_outage(exc) else EXIT_BAD_INPUT
    finally:
        client.close()
    return EXIT_OK
