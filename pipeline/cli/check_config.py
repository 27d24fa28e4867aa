"""``framebatch check-config``: every error of a config, each with its dotted path."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.common import report
from pipeline.errors import EXIT_OK


def register(commands: Any) -> None:
    check = commands.add_parser("check-config", help="validate a config and list every error")
    check.add_argument("config")
    check.add_argument("--until-done", action="store_true", help="also check it suits --until-done")
    check.set_defaults(handler=cmd_check_config)


def cmd_check_config(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_config
    from pipeline.supervisor.builders import check_run_mode

    try:
        config = load_config(args.config)
        check_run_mode(config, until_done=args.until_done)
    except ConfigError as exc:
        return report(exc)
    print(f"{args.config}: ok ({len(config.cameras)} cameras, model {config.model.path.name})")
    return EXIT_OK
