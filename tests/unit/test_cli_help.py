"""``framebatch --help`` reads like a kept command line: every command and option described, no
reStructuredText markup, metavars that say what a value is (S seconds, N a count, PATH, URL,
HOST:PORT), a version and examples."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from pipeline.cli import build_parser

RUNTIME_COMMANDS = {
    "run",
    "decode",
    "detect",
    "consume",
    "check-config",
    "export",
    "models",
    "drain",
}
TOOL_COMMANDS = {"bench", "bench-transport", "bench-gpu", "simulate", "chaos"}


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    """(command path, its parser, an action) for every action of every (sub)command."""
    for action in parser._actions:
        yield path, parser, action
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from walk(command, (*path, name))


def _name(path: tuple[str, ...], action: argparse.Action) -> str:
    where = " ".join(("framebatch", *path))
    return f"{where} {'/'.join(action.option_strings) or action.dest}"


def _problems() -> list[str]:
    problems = []
    for path, parser, action in walk(build_parser()):
        if isinstance(action, argparse._HelpAction):
            continue
        name = _name(path, action)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if not choice.help:
                    problems.append(f"{name} {choice.dest}: a command without help")
            continue
        text = " ".join(str(t) for t in (action.help, parser.description, parser.epilog) if t)
        if not action.help:
            problems.append(f"{name}: no help")
        if "``" in text or ":func:" in text or ":class:" in text:
            problems.append(f"{name}: reStructuredText markup in the help")
        takes_value = action.nargs != 0 and not isinstance(action, argparse._VersionAction)
        if action.option_strings and takes_value and action.choices is None:
            if action.metavar is None:
                problems.append(f"{name}: default metavar {action.dest.upper()} (set one)")
            elif action.type is int and action.metavar != "N":
                problems.append(f"{name}: a count or size is N, not {action.metavar}")
            elif action.type is float and not all(
                m == "S" or m.endswith("_S") for m in _metavars(action)
            ):
                problems.append(f"{name}: seconds are S, not {action.metavar}")
            elif action.type is Path and action.metavar != "PATH":
                problems.append(f"{name}: a path is PATH, not {action.metavar}")
    return problems


def _metavars(action: argparse.Action) -> tuple[str, ...]:
    metavar = action.metavar
    return metavar if isinstance(metavar, tuple) else (str(metavar),)


def test_every_command_and_option_is_described_with_a_telling_metavar() -> None:
    assert _problems() == []


def test_the_walk_sees_every_command_and_nested_ones() -> None:
    seen = {path for path, _parser, _action in walk(build_parser())}
    assert {(c,) for c in RUNTIME_COMMANDS | TOOL_COMMANDS} <= seen
    assert ("models", "fetch") in seen


def test_every_command_opens_its_help_with_a_description() -> None:
    parser = build_parser()
    for path, command, _action in walk(parser):
        if path:
            assert command.description, " ".join(path)
            assert "``" not in command.format_help(), " ".join(path)


def test_version_prints_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"framebatch {version('framebatch')}"


def test_the_top_level_help_lists_every_command_and_shows_examples() -> None:
    text = build_parser().format_help()
    for command in RUNTIME_COMMANDS | TOOL_COMMANDS:
        assert f"\n    {command} " in text or f"\n    {command}\n" in text, command
    examples = text.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert 3 <= len(examples) <= 4 and all(e.startswith("  framebatch ") for e in examples)
    assert "exit codes:" in text and "``" not in text


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["decode", "c.yaml", "--summary-json", "s.json"], "summary_json", "s.json"),
        (["consume", "--timeout", "2.5"], "timeout", 2.5),
        (["consume", "--reconnect-timeout", "1"], "reconnect_timeout", 1.0),
        (["check-config", "c.yaml", "--no-files"], "no_files", True),
        (["simulate", "--quick"], "out", None),  # a temp folder, not the checkout
    ],
)
def test_options_parse(argv: list[str], dest: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value
