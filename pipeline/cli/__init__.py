"""The ``framebatch`` command line: one module per command (or family of commands), each with
``register(commands)`` adding its parser and handler.  Commands of other packages (the tooling:
bench, simulate, chaos) register themselves through the ``framebatch.commands`` entry points;
the runtime never imports them."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from pipeline.cli import check_config, consume, drain, export, models, run

#: the runtime's commands, in the order ``--help`` lists them
COMMANDS = (run, consume, check_config, export, models, drain)
ENTRY_POINTS = "framebatch.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framebatch",
        description="Streaming video analytics: cameras -> Redis Streams -> cross-camera "
        "batched YOLOv8 -> detections in Redis.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(commands)
    for entry in entry_points(group=ENTRY_POINTS):
        entry.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return args.handler(args)


__all__ = ["build_parser", "main"]
