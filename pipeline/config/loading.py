"""YAML loading for configs: duplicate keys rejected, ``${VAR}`` expanded in string values.

Hostile YAML costs bounded time and memory: the text is capped (``MAX_CONFIG_BYTES``), nesting
is capped while composing (``MAX_DEPTH``, before Python's recursion limit), and the document's
size *with aliases expanded* is counted on the node graph before anything is built from it
(``MAX_EXPANDED_NODES``): a 500-byte alias bomb expands to billions of values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.config.errors import ConfigError, clip, format_validation_errors, line_at
from pipeline.config.schema import Config

_ENV_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


MAX_CONFIG_BYTES = 1 << 20  # a config with a thousand cameras is ~200 KB
MAX_DEPTH = 32  # the schema nests 4 levels deep
MAX_EXPANDED_NODES = 100_000  # values after alias expansion


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (YAML silently keeps the last),
    nesting deeper than ``MAX_DEPTH``, recursive aliases and alias expansion past
    ``MAX_EXPANDED_NODES`` values."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self._depth >= MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expanded_size(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and not key_node.tag.endswith(":merge"):
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_expanded_size(root: yaml.Node) -> None:
    """Count the values ``root`` stands for with every alias expanded, on the node graph (an
    alias is the same node object again), memoised, so the count costs O(nodes) not O(values)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise yaml.composer.ComposerError(
                None, None, "recursive alias (a node that contains itself)", node.start_mark
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        if total > MAX_EXPANDED_NODES:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"expands to more than {MAX_EXPANDED_NODES:,} values (YAML aliases)",
                node.start_mark,
            )
        sizes[key] = total
        return total

    size(root)


def _substitute(text: str, environ: Mapping[str, str]) -> str:
    """Expand ``${VAR}``, ``${VAR:-default}`` (default if unset or empty) and ``$${`` -> ``${``."""

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        body = match.group(1)
        ref = _ENV_BODY.fullmatch(body) if body is not None else None
        if ref is None:
            raise ValueError(
                "malformed '${...}': use ${VAR} or ${VAR:-default} ('$${' for a literal '${')"
            )
        name, default = ref.groups()
        value = environ.get(name)
        if default is not None and not value:
            return default
        if value is None:
            raise ValueError(
                f"environment variable {name!r} is not set (set it or write ${{{name}:-default}})"
            )
        return value

    return _ENV_REF.sub(expand, text)


def interpolate(
    node: Any, environ: Mapping[str, str], loc: tuple[str | int, ...], errors: list[str]
) -> Any:
    """A copy of the parsed YAML ``node`` with variables expanded in every string value."""
    if isinstance(node, str):
        try:
            return _substitute(node, environ)
        except ValueError as exc:
            errors.append(line_at(loc, str(exc)))
            return node
    if isinstance(node, Mapping):
        return {k: interpolate(v, environ, (*loc, str(k)), errors) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, environ, (*loc, i), errors) for i, v in enumerate(node)]
    return node


def parse_config(
    data: Any,
    *,
    base_dir: str | Path,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Interpolate and validate parsed YAML ``data``; relative paths are joined to ``base_dir``."""
    if not isinstance(data, Mapping):
        got = "nothing (empty file)" if data is None else type(data).__name__
        raise ConfigError([f"the config must be a mapping of settings, got {got}"], source)
    errors: list[str] = []
    data = interpolate(data, os.environ if environ is None else environ, (), errors)
    if errors:
        raise ConfigError(errors, source)
    try:
        return Config.model_validate(data, context={"base_dir": Path(base_dir)})
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, Config), source) from None


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate, resolve and validate a YAML config file; raises :class:`ConfigError`."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)  # a device or FIFO can be endless
        if len(raw) > MAX_CONFIG_BYTES:
            message = f"larger than {MAX_CONFIG_BYTES // 1024} KiB: not a framebatch config"
            raise ConfigError([message], str(path))
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError([f"file not found: {path}"], str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read file: {clip(str(exc))}"], str(path)) from None
    try:
        data = yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f" ({exc.context})" if exc.context else ""
        raise ConfigError([f"invalid YAML{where}: {exc.problem}{context}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"invalid YAML: {exc}"], str(path)) from None
    return parse_config(data, base_dir=path.absolute().parent, source=str(path), environ=environ)
