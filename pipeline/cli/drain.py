"""``framebatch drain``: account for what stopped runs left in the frames streams."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipeline.cli.common import report
from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK


def register(commands: Any) -> None:
    drain = commands.add_parser(
        "drain",
        help="account for what stopped runs left in the frames streams (no daemon running)",
    )
    drain.add_argument(
        "config", metavar="CONFIG", help="YAML config file of the stopped run (its redis.url)"
    )
    drain.set_defaults(handler=cmd_drain)


def cmd_drain(args: argparse.Namespace) -> int:
    import redis

    from pipeline.config import ConfigError, load_config
    from pipeline.ledger.accounting import Accounting
    from pipeline.ledger.acks import FrameAcks
    from pipeline.ledger.earlier_runs import drain
    from streams.keys import StreamKeys
    from streams.redis_access import describe_redis_error
    from streams.redis_connect import connect

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return report(exc)
    if not config.redis.url:
        print(
            "framebatch drain: the config has no redis.url (a private Redis keeps nothing)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    cameras = [camera.id for camera in config.cameras]
    keys = StreamKeys(config.redis.prefix)
    try:
        with connect(
            config.redis.url, reconnect_timeout_s=0, cluster=config.redis.cluster
        ) as client:
            accounting = Accounting(cameras)
            acks = FrameAcks(
                redis_client=client, keys=keys, ledger_maxlen=config.redis.detections_maxlen
            )
            drained = drain(client, keys, cameras, accounting=accounting, acks=acks)
    except redis.RedisError as exc:
        print(f"framebatch drain: {describe_redis_error(exc, config.redis.url)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    left = {c.camera: c.previous_run for c in accounting.summary().cameras if c.previous_run}
    print(f"drained {drained} entries; frames of earlier runs written to the ledger: {left}")
    return EXIT_OK
