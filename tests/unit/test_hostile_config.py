"""Hostile configs cost bounded time and memory and give one clear line each."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.config import MAX_CAMERAS_PER_DAEMON, ConfigError, load_config
from pipeline.config.loading import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_EXPANDED_NODES

VALID = "model: {path: m.onnx}\ncameras: [{id: a, url: a.mp4}]\n"

# nine levels of nine aliases: 9**9 values once expanded, in under 500 bytes
ALIAS_BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{chr(ord('a') + level)}: &{chr(ord('a') + level)} "
        + "["
        + ",".join([f"*{chr(ord('a') + level - 1)}"] * 9)
        + "]"
        for level in range(1, 9)
    ]
    + ["model: {path: m.onnx}", "cameras: [{id: a, url: a.mp4}]"]
)


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, text))
    assert time.monotonic() - started < 10  # bounded: never the seconds an expansion takes
    message = str(caught.value)
    assert len(message) < 2000, "an error line must not echo megabytes"
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(ALIAS_BOMB, f"more than {MAX_EXPANDED_NODES:,} values", id="alias-bomb"),
        pytest.param("a: &x [*x]\n" + VALID, "recursive alias", id="recursive-alias"),
        pytest.param("[" * 20_000 + "]" * 20_000, f"deeper than {MAX_DEPTH}", id="deep-flow"),
        pytest.param(
            "".join(f"{'  ' * i}k{i}:\n" for i in range(200)),
            f"deeper than {MAX_DEPTH}",
            id="deep-block",
        ),
        pytest.param(
            "redis: {prefix: '" + "p" * 50_000_000 + "'}\n" + VALID,
            f"larger than {MAX_CONFIG_BYTES // 1024} KiB",
            id="50MB-prefix",
        ),
        pytest.param(
            "redis: {prefix: '" + "p" * 100_000 + "'}\n" + VALID,
            "redis.prefix: invalid key prefix 'pppp",
            id="long-prefix-cut",
        ),
        pytest.param(
            "? " + "x" * 100_000 + "\n: 1\n" + VALID,
            "unknown top-level key 'xxx",
            id="long-unknown-key",
        ),
        pytest.param(
            VALID.replace("a.mp4}", "a.mp4, fps: 1e-300}"),
            "cameras[0].fps: must be >=",
            id="fps-tiny",
        ),
        pytest.param(
            VALID.replace("a.mp4}", "a.mp4, fps: 1e9}"), "cameras[0].fps: must be <=", id="fps-huge"
        ),
        pytest.param(
            "model: {path: m.onnx}\ncameras:\n"
            + "".join(f"  - {{id: c{i}, url: c.mp4}}\n" for i in range(MAX_CAMERAS_PER_DAEMON + 1)),
            f"cameras: at most {MAX_CAMERAS_PER_DAEMON} items",
            id="too-many-cameras",
        ),
    ],
)
def test_hostile_yaml_is_one_bounded_error(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, text)


def test_long_values_are_cut_and_say_their_length(tmp_path: Path) -> None:
    message = _error(tmp_path, "redis: {prefix: '" + "p" * 100_000 + "'}\n" + VALID)
    assert "(100,000 characters)" in message


def test_a_config_at_the_camera_cap_is_valid(tmp_path: Path) -> None:
    text = "model: {path: m.onnx}\ncameras:\n" + "".join(
        f"  - {{id: c{i}, url: c.mp4}}\n" for i in range(MAX_CAMERAS_PER_DAEMON)
    )
    assert len(load_config(_config(tmp_path, text)).cameras) == MAX_CAMERAS_PER_DAEMON


def test_ordinary_aliases_still_work(tmp_path: Path) -> None:
    text = (
        "model: {path: m.onnx}\n"
        "cameras:\n  - &cam {id: a, url: a.mp4, priority: 2}\n  - {<<: *cam, id: b}\n"
    )
    config = load_config(_config(tmp_path, text))
    assert [(c.id, c.priority) for c in config.cameras] == [("a", 2), ("b", 2)]
