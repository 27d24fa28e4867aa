"""The ``framebatch`` command line: one module per command (or family of commands), each with
``register(commands)`` adding its parser and handler.  Commands of other packages (the tooling:
bench, simulate, chaos) register themselves through the ``framebatch.commands`` entry points;
the runtime never imports them.

Every command and option is described (``tests/unit/test_cli_help.py`` walks the parser), and
metavars say what a value is: ``S`` seconds, ``N`` a count or size, ``PATH``, ``URL``,
``HOST:PORT``, ``CONFIG`` the YAML config file."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version

from pipeline.cli import check_config, consume, drain, export, models, run
from streams.logs import LOG_FORMAT

#: the runtime's commands, in the order ``--help`` lists them
COMMANDS = (run, consume, check_config, export, models, drain)
ENTRY_POINTS = "framebatch.commands"
DISTRIBUTION = "framebatch"

EPILOG = """\
examples:
  framebatch check-config configs/replay.yaml        every error, with its dotted path
  framebatch run configs/replay.yaml --until-done    a replay: exits when all is processed
  framebatch run configs/rtsp.yaml --http off        a daemon without the HTTP endpoint
  framebatch consume --from-start --count 10         detections as JSON lines

exit codes: 0 done; 1 a camera did not reach its end; 2 bad input at start (one line);
3 the run broke off (Redis away past its timeout, a stage died).
'framebatch COMMAND --help' describes each command; docs/ and README.md say more."""


def framebatch_version() -> str:
    """The installed distribution's version, or a line saying it is not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed as a package: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framebatch",
        description="Streaming video analytics: cameras -> Redis Streams -> cross-camera\n"
        "batched YOLOv8 -> detections in Redis.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-V",
        "--version",
        action="version",
        version=f"%(prog)s {framebatch_version()}",
        help="print the version and exit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )
    for module in COMMANDS:
        module.register(commands)
    for entry in entry_points(group=ENTRY_POINTS):
        entry.load()(commands)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """A command's ``--help`` opens with its one-line summary where it sets no description
    of its own (nested commands too: ``models fetch``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, command in action.choices.items():
                if command.description is None and summaries.get(name):
                    command.description = summaries[name][:1].upper() + summaries[name][1:] + "."
                _describe(command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=LOG_FORMAT,  # every process's, decoders' included
        stream=sys.stderr,
    )
    return args.handler(args)


__all__ = ["build_parser", "framebatch_version", "main"]
