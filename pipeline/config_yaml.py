"""YAML loading for configs: duplicate keys rejected, ``${VAR}`` expanded in string values."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from pipeline.config_errors import line_at

_ENV_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (YAML silently keeps the last)."""

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
