"""Config layer: valid configs parse to the expected values, invalid ones fail with exact lines."""

from __future__ import annotations

import copy
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from pipeline.batching import policy_names
from pipeline.config import (
    BatchingConfig,
    CameraConfig,
    Config,
    ConfigError,
    ModelConfig,
    RedisConfig,
    format_validation_errors,
    load_config,
    parse_config,
)
from streams.urls import redact_url

BASE = Path("/etc/framebatch")
SECRET = "hunter2"
MINIMAL: dict[str, Any] = {
    "model": {"path": "yolov8n.onnx"},
    "cameras": [{"id": "door", "url": "rtsp://cam-door/stream1"}],
}


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with ``patch`` merged in (dicts merge, anything else replaces)."""
    result = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def without(base: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in copy.deepcopy(base).items() if k != key}


def camera(**fields: Any) -> dict[str, Any]:
    """MINIMAL with its one camera replaced by ``fields`` (id defaults to 'door')."""
    return merged(MINIMAL, {"cameras": [{"id": "door", **fields}]})


def pluck(obj: Any, dotted: str) -> Any:
    """``pluck(config, "cameras[0].url")`` -> config.cameras[0].url."""
    for name, index in re.findall(r"([A-Za-z_]\w*)|\[(\d+)\]", dotted):
        obj = getattr(obj, name) if name else obj[int(index)]
    return obj


def parse_errors(data: Any, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, base_dir=BASE, environ=environ or {})
    return info.value.errors


# ------------------------------------------------------------------------------- valid configs

FULL: dict[str, Any] = {
    "redis": {
        "url": "redis://:pw@redis.local:6380/2",
        "prefix": "site-a.fb_1",
        "frames_maxlen": 32,
        "detections_maxlen": 5000,
    },
    "model": {
        "path": "/models/yolov8s.onnx",
        "backend": "onnxruntime",
        "imgsz": 1280,
        "conf": 0.4,
        "iou": 0.6,
        "max_det": 100,
        "classes": [0, 2, 999],
        "threads": 4,
    },
    "batching": {"max_batch_size": 256, "max_wait_ms": 0},
    "cameras": [
        {"id": "door", "url": "rtsps://admin:pw@cam-door:322/live", "fps": 12.5, "max_backlog": 4},
        {"id": "clip.1", "url": "/data/clip.mp4", "realtime": True, "loop": True, "fps": 30},
    ],
}

VALID = [
    pytest.param(
        MINIMAL,
        {},
        {
            "redis.url": None,
            "redis.prefix": "fb",
            "redis.frames_maxlen": 64,
            "redis.detections_maxlen": 100_000,
            "model.path": BASE / "yolov8n.onnx",
            "model.backend": "auto",
            "model.imgsz": 640,
            "model.conf": 0.25,
            "model.iou": 0.45,
            "model.max_det": 300,
            "model.classes": None,
            "model.threads": None,
            "batching.max_batch_size": 8,
            "batching.max_wait_ms": 50.0,
            "cameras[0].url": "rtsp://cam-door/stream1",
            "cameras[0].realtime": None,
            "cameras[0].loop": False,
            "cameras[0].fps": None,
            "cameras[0].max_backlog": None,
            "cameras[0].is_live": True,
            "sinks[0].kind": "redis_streams",
        },
        id="minimal-with-defaults",
    ),
    pytest.param(
        merged(
            MINIMAL,
            {"sinks": [{"kind": "jsonl", "path": "out/d.jsonl"}, {"kind": "redis_streams"}]},
        ),
        {},
        {
            "sinks[0].kind": "jsonl",
            "sinks[0].path": BASE / "out" / "d.jsonl",
            "sinks[0].fsync": False,
            "sinks[1].kind": "redis_streams",
        },
        id="sinks-in-order-relative-to-the-config",
    ),
    pytest.param(
        FULL,
        {},
        {
            "redis.url": "redis://:pw@redis.local:6380/2",
            "redis.prefix": "site-a.fb_1",
            "redis.frames_maxlen": 32,
            "redis.detections_maxlen": 5000,
            "model.path": Path("/models/yolov8s.onnx"),
            "model.backend": "onnxruntime",
            "model.imgsz": 1280,
            "model.conf": 0.4,
            "model.iou": 0.6,
            "model.max_det": 100,
            "model.classes": [0, 2, 999],
            "model.threads": 4,
            "batching.max_batch_size": 256,
            "batching.max_wait_ms": 0.0,
            "cameras[0].url": "rtsps://admin:pw@cam-door:322/live",
            "cameras[0].is_live": True,
            "cameras[0].fps": 12.5,
            "cameras[0].max_backlog": 4,
            "cameras[1].id": "clip.1",
            "cameras[1].url": "/data/clip.mp4",
            "cameras[1].is_live": False,
            "cameras[1].realtime": True,
            "cameras[1].loop": True,
            "cameras[1].fps": 30.0,
        },
        id="full",
    ),
    pytest.param(
        merged(
            MINIMAL,
            {
                "redis": {"url": "${REDIS_URL:-redis://localhost:6379/0}", "prefix": "${PREFIX}"},
                "model": {"path": "${MODEL_DIR:-models}/yolov8n.onnx"},
                "batching": {"max_batch_size": "${BATCH}", "max_wait_ms": "${WAIT_MS:-25}"},
                "cameras": [
                    {"id": "door", "url": "rtsp://admin:${CAM_PASS}@cam-door/s1"},
                    {"id": "yard", "url": "/clips/$${literal}.mp4"},
                ],
            },
        ),
        {"PREFIX": "prod", "BATCH": "16", "WAIT_MS": "", "CAM_PASS": "p@ss: #w{rd}'\""},
        {
            "redis.url": "redis://localhost:6379/0",
            "redis.prefix": "prod",
            "model.path": BASE / "models/yolov8n.onnx",
            "batching.max_batch_size": 16,
            "batching.max_wait_ms": 25.0,
            "cameras[0].url": "rtsp://admin:p@ss: #w{rd}'\"@cam-door/s1",
            "cameras[1].url": "/clips/${literal}.mp4",
        },
        id="env-interpolation-defaults-and-escape",
    ),
    pytest.param(
        merged(
            MINIMAL,
            {
                "model": {"path": "models/yolov8n.onnx"},
                "cameras": [
                    {"id": "a", "url": "clips/a.mp4"},
                    {"id": "b", "url": "../shared/b.mp4"},
                    {"id": "c", "url": "/abs/c.mp4"},
                    {"id": "d", "url": "rtsp://cam-d/stream"},
                ],
            },
        ),
        {},
        {
            "model.path": BASE / "models/yolov8n.onnx",
            "cameras[0].url": str(BASE / "clips/a.mp4"),
            "cameras[1].url": str(BASE / "../shared/b.mp4"),
            "cameras[2].url": "/abs/c.mp4",
            "cameras[3].url": "rtsp://cam-d/stream",
            "cameras[0].is_live": False,
            "cameras[3].is_live": True,
        },
        id="relative-paths-resolved-against-config-dir",
    ),
    pytest.param(
        merged(
            MINIMAL,
            {
                "cameras": [
                    {"id": "a", "url": "file:///data/clip.mp4", "loop": True},
                    {"id": "b", "url": "file://localhost/data/my%20clip.mp4"},
                    {"id": "c", "url": "FILE:///data/c.mp4"},
                ]
            },
        ),
        {},
        {
            "cameras[0].url": "/data/clip.mp4",
            "cameras[0].is_live": False,
            "cameras[0].loop": True,
            "cameras[1].url": "/data/my clip.mp4",
            "cameras[2].url": "/data/c.mp4",
        },
        id="file-urls-become-paths",
    ),
    pytest.param(
        merged(
            MINIMAL,
            {
                "redis": {"frames_maxlen": 2},
                "model": {"conf": 1, "iou": 1, "imgsz": 32, "classes": [0], "max_det": 1},
                "batching": {"max_batch_size": 1},
                "cameras": [{"id": "x" * 64, "url": "rtsp://c/s", "max_backlog": 2}],
            },
        ),
        {},
        {
            "redis.frames_maxlen": 2,
            "model.conf": 1.0,
            "model.imgsz": 32,
            "cameras[0].id": "x" * 64,
            "cameras[0].max_backlog": 2,
        },
        id="boundary-values",
    ),
]


@pytest.mark.parametrize(("data", "environ", "expected"), VALID)
def test_valid_config(data: dict[str, Any], environ: dict[str, str], expected: dict[str, Any]):
    config = parse_config(data, base_dir=BASE, environ=environ)
    assert {path: pluck(config, path) for path in expected} == expected


# ----------------------------------------------------------------------------- invalid configs

KEY_RULE = ": use 1-64 letters, digits, '_', '.' or '-' (it becomes part of Redis keys)"

INVALID = [
    # unknown keys, with close-match hints
    (merged(MINIMAL, {"batchng": {}}), "unknown top-level key 'batchng'; did you mean 'batching'?"),
    (
        merged(MINIMAL, {"batching": {"max_wiat_ms": 10}}),
        "batching: unknown key 'max_wiat_ms'; did you mean 'max_wait_ms'?",
    ),
    (
        merged(MINIMAL, {"model": {"thread": 2}}),
        "model: unknown key 'thread'; did you mean 'threads'?",
    ),
    (
        camera(url="rtsp://c/s", fsp=10),
        "cameras[0]: unknown key 'fsp'; did you mean 'fps'?",
    ),
    (
        camera(url="rtsp://c/s", colour="red"),
        "cameras[0]: unknown key 'colour' (expected one of: id, url, realtime, as_live, loop, fps, "
        "max_backlog, vid_stride, max_fps, decode_frames, priority, decode_weight, "
        "max_wait_frames, max_wait_ms, max_frame_age_ms, keep_latest, analytics)",
    ),
    # missing / empty / wrong shape
    (without(MINIMAL, "model"), "model: required"),
    (without(MINIMAL, "cameras"), "cameras: required"),
    (merged(MINIMAL, {"cameras": []}), "cameras: must not be empty"),
    (merged(MINIMAL, {"model": {"path": None}}), "model.path: must be a file path (got null)"),
    (merged(MINIMAL, {"cameras": [{"id": "door"}]}), "cameras[0].url: required"),
    (MINIMAL | {"model": {}}, "model.path: required"),
    (merged(MINIMAL, {"batching": 5}), "batching: must be a mapping (got int)"),
    (merged(MINIMAL, {"cameras": {"id": "door"}}), "cameras: must be a list (got mapping)"),
    (
        merged(MINIMAL, {"batching": {"max_batch_size": "eight"}}),
        "batching.max_batch_size: must be an integer (got string)",
    ),
    (
        merged(MINIMAL, {"batching": {"max_batch_size": 8.5}}),
        "batching.max_batch_size: must be a whole number (got 8.5)",
    ),
    (
        camera(url="rtsp://c/s", loop="sometimes"),
        "cameras[0].loop: must be true or false (got string)",
    ),
    ([MINIMAL], "the config must be a mapping of settings, got list"),
    (None, "the config must be a mapping of settings, got nothing (empty file)"),
    # cameras
    (
        camera(id="front door", url="rtsp://c/s"),
        "cameras[0].id: invalid camera id 'front door': use 1-64 letters, digits, '_', '.' or '-' "
        "(it becomes part of Redis keys)",
    ),
    (camera(id="a:b", url="rtsp://c/s"), "cameras[0].id: invalid camera id 'a:b'" + KEY_RULE),
    (camera(id="", url="rtsp://c/s"), "cameras[0].id: invalid camera id ''" + KEY_RULE),
    (
        camera(id="x" * 65, url="rtsp://c/s"),
        f"cameras[0].id: invalid camera id '{'x' * 65}'" + KEY_RULE,
    ),
    (
        merged(
            MINIMAL,
            {
                "cameras": [
                    {"id": "door", "url": "rtsp://c/1"},
                    {"id": "yard", "url": "rtsp://c/2"},
                    {"id": "door", "url": "rtsp://c/3"},
                ]
            },
        ),
        "cameras[2].id: duplicate camera id 'door' (also cameras[0])",
    ),
    (
        camera(url="htp://x"),
        "cameras[0].url: unsupported URL scheme 'htp' in 'htp://x' "
        "(expected rtsp://, rtsps:// or a file path)",
    ),
    (
        camera(url="http://cam/video.mjpg"),
        "cameras[0].url: unsupported URL scheme 'http' in 'http://cam/video.mjpg' "
        "(expected rtsp://, rtsps:// or a file path)",
    ),
    (camera(url=""), "cameras[0].url: must not be empty"),
    (
        camera(url="rtsp://cam/1", loop=True),
        "cameras[0].loop: loop is only for files; 'rtsp://cam/1' is a live source",
    ),
    (
        camera(url="rtsp://cam/1", as_live=True),
        "cameras[0].as_live: as_live is only for files; 'rtsp://cam/1' is a live source",
    ),
    (
        camera(url="clip.mp4", as_live=True, realtime=False),
        "cameras[0].realtime: as_live replays the file at its frame rate: leave realtime unset "
        "or true",
    ),
    (camera(url="rtsp://c/s", fps=0), "cameras[0].fps: must be >= 0.1 (got 0)"),
    (
        camera(url="rtsp://c/s", fps=float("nan")),
        "cameras[0].fps: must be a finite number (got nan)",
    ),
    (camera(url="rtsp://c/s", max_backlog=0), "cameras[0].max_backlog: must be >= 1 (got 0)"),
    (
        camera(url="rtsp://c/s", max_backlog=65),
        "cameras[0].max_backlog: must be <= redis.frames_maxlen (64)",
    ),
    # batching
    (
        merged(MINIMAL, {"batching": {"max_batch_size": 0}}),
        "batching.max_batch_size: must be >= 1 (got 0)",
    ),
    (
        merged(MINIMAL, {"batching": {"max_batch_size": 257}}),
        "batching.max_batch_size: must be <= 256 (got 257)",
    ),
    (
        merged(MINIMAL, {"batching": {"max_wait_ms": -1}}),
        "batching.max_wait_ms: must be >= 0.0 (got -1)",
    ),
    # model
    (merged(MINIMAL, {"model": {"conf": 1.5}}), "model.conf: must be <= 1.0 (got 1.5)"),
    (merged(MINIMAL, {"model": {"conf": -0.1}}), "model.conf: must be >= 0.0 (got -0.1)"),
    (merged(MINIMAL, {"model": {"iou": 0}}), "model.iou: must be > 0.0 (got 0)"),
    (merged(MINIMAL, {"model": {"imgsz": 650}}), "model.imgsz: must be a multiple of 32 (got 650)"),
    (merged(MINIMAL, {"model": {"imgsz": 4128}}), "model.imgsz: must be <= 4096 (got 4128)"),
    (merged(MINIMAL, {"model": {"imgsz": 0}}), "model.imgsz: must be >= 32 (got 0)"),
    (
        merged(MINIMAL, {"model": {"classes": [0, 1000]}}),
        "model.classes[1]: must be <= 999 (got 1000)",
    ),
    (merged(MINIMAL, {"model": {"classes": [-1]}}), "model.classes[0]: must be >= 0 (got -1)"),
    (merged(MINIMAL, {"model": {"classes": []}}), "model.classes: must not be empty"),
    (merged(MINIMAL, {"model": {"max_det": 0}}), "model.max_det: must be >= 1 (got 0)"),
    (merged(MINIMAL, {"model": {"threads": 0}}), "model.threads: must be >= 1 (got 0)"),
    (
        merged(MINIMAL, {"model": {"path": "weights/yolov8n.tflite"}}),
        "model.path: unsupported model file 'yolov8n.tflite' "
        "(supported suffixes: .onnx, .xml, .engine, .torchscript, .pt; or a known model: yolov8n)",
    ),
    (
        merged(MINIMAL, {"model": {"backend": "tflite"}}),
        "model.backend: must be 'auto', 'onnxruntime', 'openvino', 'tensorrt', 'torchscript' or "
        "'ultralytics'",
    ),
    # redis
    (
        merged(MINIMAL, {"redis": {"frames_maxlen": 1}}),
        "redis.frames_maxlen: must be >= 2 (got 1)",
    ),
    (
        merged(MINIMAL, {"redis": {"detections_maxlen": 0}}),
        "redis.detections_maxlen: must be >= 1 (got 0)",
    ),
    (
        merged(MINIMAL, {"redis": {"prefix": "fb:x"}}),
        "redis.prefix: invalid key prefix 'fb:x'" + KEY_RULE,
    ),
    # environment interpolation
    (
        camera(url="rtsp://admin:${CAM_PASS}@cam/1"),
        "cameras[0].url: environment variable 'CAM_PASS' is not set "
        "(set it or write ${CAM_PASS:-default})",
    ),
    (
        merged(MINIMAL, {"model": {"path": "${1DIR}/m.onnx"}}),
        "model.path: malformed '${...}': use ${VAR} or ${VAR:-default} ('$${' for a literal '${')",
    ),
    (
        merged(MINIMAL, {"model": {"path": "${DIR/m.onnx"}}),
        "model.path: malformed '${...}': use ${VAR} or ${VAR:-default} ('$${' for a literal '${')",
    ),
    # sinks: a tagged union, one module each
    (
        merged(MINIMAL, {"sinks": [{"kind": "kafka"}]}),
        "sinks[0].kind: unknown 'kafka' (one of: jsonl, redis_streams)",
    ),
    (
        merged(MINIMAL, {"sinks": [{"path": "d.jsonl"}]}),
        "sinks[0].kind: required (one of: jsonl, redis_streams)",
    ),
    (merged(MINIMAL, {"sinks": [{"kind": "jsonl"}]}), "sinks[0].path: required"),
    (
        merged(MINIMAL, {"sinks": [{"kind": "jsonl", "path": "d", "fsnc": True}]}),
        "sinks[0]: unknown key 'fsnc'; did you mean 'fsync'?",
    ),
    (
        merged(
            MINIMAL,
            {"sinks": [{"kind": "redis_streams"}, {"kind": "jsonl", "path": "d", "fsync": "x"}]},
        ),
        "sinks[1].fsync: must be true or false (got string)",
    ),
    (merged(MINIMAL, {"sinks": []}), "sinks: must not be empty"),
    (
        merged(MINIMAL, {"model": {"path": "m.onnx", "instances": 4, "threads": 2}}),
        "model.threads: 2 threads cannot run 4 instances (one thread each at least): raise "
        "threads or lower instances",
    ),
    (
        merged(MINIMAL, {"model": {"path": "m.onnx", "instances": 0}}),
        "model.instances: must be >= 1 (got 0)",
    ),
    (
        merged(MINIMAL, {"sinks": [{"kind": "jsonl", "path": "d.jsonl"}]}),
        "sinks: must include {kind: redis_streams}: the accounting of a run after a crash "
        "reads the detections streams",
    ),
    (merged(MINIMAL, {"sinks": ["jsonl"]}), "sinks[0]: must be a mapping (got string)"),
    (
        merged(MINIMAL, {"redis": {"cluster": True}}),
        "redis: cluster: true needs url: a node of the Redis Cluster to use",
    ),
]


@pytest.mark.parametrize(("data", "expected"), INVALID, ids=[e for _, e in INVALID])
def test_invalid_config(data: Any, expected: str):
    errors = parse_errors(data)
    assert expected in errors


def test_every_error_is_reported_at_once():
    data = merged(MINIMAL, {"model": {"imgsz": 650}, "batching": {"max_batch_size": 0}})
    assert parse_errors(data) == [
        "model.imgsz: must be a multiple of 32 (got 650)",
        "batching.max_batch_size: must be >= 1 (got 0)",
    ]


# --------------------------------------------------------------------------- secrets in errors

LEAKY = [
    camera(url=f"htp://admin:{SECRET}@cam/1"),
    camera(url=f"rtsp://admin:{SECRET}@cam/1", loop=True),
    camera(url=f"rtsp://admin:{SECRET}@cam/1", fps=-1, id="bad id"),
    camera(url="rtsp://admin:${CAM_PASS}@cam/1", loop=True),
    camera(url="htp://admin:${CAM_PASS}@cam/1"),
    merged(MINIMAL, {"redis": {"url": "redis://:${CAM_PASS}@r/0", "frames_maxlen": "x"}}),
]


@pytest.mark.parametrize("data", LEAKY)
def test_password_never_appears_in_errors(data: dict[str, Any]):
    with pytest.raises(ConfigError) as info:
        parse_config(data, base_dir=BASE, environ={"CAM_PASS": SECRET})
    assert info.value.errors
    assert SECRET not in str(info.value)
    assert all(SECRET not in line for line in info.value.errors)


@pytest.mark.parametrize(
    "url", [f"htp://admin:{SECRET}@cam/1", f"rtsp://admin:{SECRET}@cam/1", f"rtsp://u:{SECRET}@"]
)
def test_pydantic_error_text_never_shows_password(url: str):
    with pytest.raises(ValidationError) as info:
        CameraConfig(id="door", url=url, loop=True)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("rtsp://admin:hunter2@10.0.0.5:554/stream1", "rtsp://admin:***@10.0.0.5:554/stream1"),
        ("rtsps://admin:p@ss@cam/s", "rtsps://admin:***@cam/s"),
        ("redis://:hunter2@localhost:6379/0", "redis://:***@localhost:6379/0"),
        ("RTSP://Admin:x/y@cam/s", "RTSP://Admin:***@cam/s"),
        ("rtsp://admin@cam/s", "rtsp://admin@cam/s"),
        ("rtsp://cam:554/stream", "rtsp://cam:554/stream"),
        ("rtsp://cam/user@1", "rtsp://cam/user@1"),
        ("/data/clip.mp4", "/data/clip.mp4"),
        (
            "cannot open 'rtsp://a:hunter2@cam/1' (timeout)",
            "cannot open 'rtsp://a:***@cam/1' (timeout)",
        ),
    ],
)
def test_redact_url(url: str, expected: str):
    assert redact_url(url) == expected


# ------------------------------------------------------------------------------ loading files

GOOD_YAML = """\
redis:
  url: ${REDIS_URL:-redis://localhost:6379/0}
model:
  path: models/yolov8n.onnx
batching:
  max_wait_ms: 20
cameras:
  - id: door
    url: rtsp://admin:${CAM_PASS}@cam-door/stream1
  - id: clip
    url: clips/parking.mp4
    realtime: true
"""


def test_load_config_resolves_against_config_folder(tmp_path: Path, monkeypatch):
    config_file = tmp_path / "conf" / "site.yaml"
    config_file.parent.mkdir()
    config_file.write_text(GOOD_YAML)
    monkeypatch.chdir(tmp_path)  # resolution must not depend on the working directory
    config = load_config("conf/site.yaml", environ={"CAM_PASS": "a: #'\"b"})
    assert config.model.path == tmp_path / "conf/models/yolov8n.onnx"
    assert config.camera("clip").url == str(tmp_path / "conf/clips/parking.mp4")
    assert config.camera("door").url == "rtsp://admin:a: #'\"b@cam-door/stream1"
    assert config.redis.url == "redis://localhost:6379/0"
    assert config.batching.max_wait_ms == 20.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "model:\n  path: m.onnx\ncameras:\n  - id: a\n   url: x.mp4\n",
            "invalid YAML at line 5, column 4: expected <block end>, "
            "but found '<block mapping start>' (while parsing a block collection)",
        ),
        (
            "model:\n  path: [m.onnx\ncameras: []\n",
            "invalid YAML at line 3, column 8: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence)",
        ),
        (
            "model:\n  path: m.onnx\ncameras:\n  - {id: a, url: x.mp4}\nmodel:\n  path: n.onnx\n",
            "invalid YAML at line 5, column 1: duplicate key 'model'",
        ),
        ("", "the config must be a mapping of settings, got nothing (empty file)"),
        ("- just\n- a list\n", "the config must be a mapping of settings, got list"),
        (
            "model:\n  path: m.onnx\ncameras:\n  - {id: a, url: 'rtsp://u:${PASS}@c/1'}\n",
            "cameras[0].url: environment variable 'PASS' is not set "
            "(set it or write ${PASS:-default})",
        ),
    ],
    ids=["bad-indent", "unclosed-flow", "duplicate-key", "empty", "list", "unset-env"],
)
def test_load_config_errors(tmp_path: Path, text: str, expected: str):
    config_file = tmp_path / "site.yaml"
    config_file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(config_file, environ={})
    assert info.value.errors == [expected]
    assert info.value.source == str(config_file)


def test_load_config_missing_file(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert info.value.errors == [f"file not found: {missing}"]


def test_config_error_reads_as_a_list_and_pickles():
    error = ConfigError(["model: required", "cameras: required"], source="site.yaml")
    assert str(error) == (
        "invalid config site.yaml (2 errors):\n  - model: required\n  - cameras: required"
    )
    copied = pickle.loads(pickle.dumps(error))
    assert (copied.errors, copied.source, str(copied)) == (error.errors, error.source, str(error))


# ----------------------------------------------------------------------------- model behaviour


def test_format_validation_errors_on_a_sub_model():
    with pytest.raises(ValidationError) as info:
        BatchingConfig.model_validate({"max_wiat_ms": 5, "max_batch_size": -1})
    assert format_validation_errors(info.value, BatchingConfig) == [
        "max_batch_size: must be >= 1 (got -1)",
        "unknown top-level key 'max_wiat_ms'; did you mean 'max_wait_ms'?",
    ]


class _Inner(BaseModel):
    model_config = {"extra": "forbid"}
    threshold: float = 0.5


class _Outer(BaseModel):
    model_config = {"extra": "forbid"}
    maybe: _Inner | None = None
    many: list[_Inner] | None = None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"maybe": {"treshold": 1}}, "maybe: unknown key 'treshold'; did you mean 'threshold'?"),
        (
            {"many": [{}, {"threshld": 1}]},
            "many[1]: unknown key 'threshld'; did you mean 'threshold'?",
        ),
        ({"mnay": []}, "unknown top-level key 'mnay'; did you mean 'many'?"),
    ],
)
def test_unknown_key_hint_walks_optionals_and_lists(data: dict[str, Any], expected: str):
    with pytest.raises(ValidationError) as info:
        _Outer.model_validate(data)
    assert format_validation_errors(info.value, _Outer) == [expected]


def test_camera_lookup():
    config = parse_config(FULL, base_dir=BASE)
    assert config.camera("clip.1").url == "/data/clip.mp4"
    with pytest.raises(KeyError, match="unknown camera id 'nope' \\(configured: door, clip.1\\)"):
        config.camera("nope")


def test_models_are_frozen():
    config = parse_config(MINIMAL, base_dir=BASE)
    with pytest.raises(ValidationError):
        config.batching.max_batch_size = 4  # type: ignore[misc]


@pytest.mark.parametrize("model", [Config, RedisConfig, ModelConfig, BatchingConfig, CameraConfig])
def test_every_field_is_described_and_extra_keys_forbidden(model: type[BaseModel]):
    assert model.model_config.get("extra") == "forbid"
    assert model.model_config.get("frozen") is True
    assert [name for name, f in model.model_fields.items() if not f.description] == []


def test_environ_defaults_to_process_environment(monkeypatch):
    monkeypatch.setenv("FB_TEST_MODEL", "from-env.onnx")
    config = parse_config(merged(MINIMAL, {"model": {"path": "${FB_TEST_MODEL}"}}), base_dir=BASE)
    assert config.model.path == BASE / "from-env.onnx"


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[2] / "configs").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_config_is_valid(path: Path, monkeypatch):
    monkeypatch.setenv("CAM_USER", "viewer")
    monkeypatch.setenv("CAM_PASSWORD", SECRET)
    config = load_config(path)
    assert config.cameras


@pytest.mark.parametrize(
    ("http", "expected"),
    [
        ({}, "127.0.0.1:9108"),
        ({"listen": "[::1]:0"}, "[::1]:0"),
        ({"listen": None}, None),
        ({"listen": "0.0.0.0:9108", "token": "t" * 16}, "0.0.0.0:9108"),
    ],
)
def test_http_listen(http: dict[str, Any], expected: str | None):
    config = parse_config(merged(MINIMAL, {"http": http}), base_dir=BASE)
    assert config.http.listen == expected


@pytest.mark.parametrize(
    ("http", "line"),
    [
        ({"listen": "9108"}, "http.listen: expected host:port"),
        ({"listen": "host:99999"}, "http.listen: expected host:port"),
        ({"listen": "0.0.0.0:9108"}, "http.token: required when listen (0.0.0.0:9108) is not"),
        ({"listen": "127.0.0.1:1", "token": "short"}, "http.token: "),
    ],
)
def test_bad_http_settings_name_the_field(http: dict[str, Any], line: str):
    with pytest.raises(ConfigError) as info:
        parse_config(merged(MINIMAL, {"http": http}), base_dir=BASE)
    assert any(error.startswith(line) for error in info.value.errors), info.value.errors
    assert "short" not in str(info.value)  # a token never shows in an error


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/clips/a\n2026-12-03 ERROR forged", "must not contain control characters"),
        ("/clips/a\x00.mp4", "must not contain control characters"),
        ("file:///clips/a%0A2026-12-03 ERROR forged", "must not contain control characters"),
        ("rtsp://[::1/stream", "not a valid URL"),
        (f"rtsp://user:{SECRET}@[cam/x", "not a valid URL"),
        ("rtsp:///stream", "no host in"),
    ],
)
def test_a_camera_url_that_cannot_be_opened_or_logged_safely_is_refused(url: str, message: str):
    with pytest.raises(ConfigError) as info:
        parse_config(camera(url=url), base_dir=BASE)
    [error] = info.value.errors
    assert error.startswith("cameras[0].url: " + message), error
    assert SECRET not in error and "\n" not in error


# ------------------------------------------------------------ batching policies and their settings


@pytest.mark.parametrize(
    ("batching", "expected"),
    [
        ({}, {"name": "adaptive", "target_utilisation": 0.85}),
        ({"target_utilisation": 0.9}, {"name": "adaptive", "target_utilisation": 0.9}),
        (
            {"policy": "adaptive", "target_utilisation": 0.9},
            {"name": "adaptive", "target_utilisation": 0.9},
        ),
        ({"policy": "aimd"}, {"name": "aimd", "latency_target_ms": 200.0}),
        (
            {"policy": "aimd", "latency_target_ms": 300, "max_wait_ms": 20},
            {"name": "aimd", "latency_target_ms": 300.0},
        ),
        ({"policy": "timeout"}, {"name": "timeout"}),
        ({"policy": "batch1"}, {"name": "batch1"}),
    ],
)
def test_the_chosen_policys_settings_sit_beside_it(
    batching: dict[str, Any], expected: dict[str, Any]
):
    config = parse_config(merged(MINIMAL, {"batching": batching}), base_dir=BASE)
    assert config.batching.policy == expected["name"]
    assert config.batching.policy_options.model_dump() == expected


AIMD_S, ADAPTIVE_S = "a setting of the aimd policy", "a setting of the adaptive policy"


@pytest.mark.parametrize(
    ("batching", "expected"),
    [
        (
            {"policy": "adaptive", "latency_target_ms": 300},
            [f"batching.latency_target_ms: {AIMD_S}; batching.policy is adaptive"],
        ),
        (
            {"latency_target_ms": 300},  # the default policy, adaptive
            [f"batching.latency_target_ms: {AIMD_S}; batching.policy is adaptive"],
        ),
        (
            {"policy": "timeout", "target_utilisation": 0.9},
            [f"batching.target_utilisation: {ADAPTIVE_S}; batching.policy is timeout"],
        ),
        (
            {"policy": "adaptive", "target_utilisation": 1.5},
            ["batching.target_utilisation: must be <= 1.0 (got 1.5)"],
        ),
        (
            {"policy": "adaptive", "target_utilisation": 0},
            ["batching.target_utilisation: must be > 0.0 (got 0)"],
        ),
        (
            {"policy": "aimd", "latency_target_ms": "fast"},
            ["batching.latency_target_ms: must be a number (got string)"],
        ),
        (
            {"policy": "aimd", "latency_target_ms": float("inf")},
            ["batching.latency_target_ms: must be a finite number (got inf)"],
        ),
        (
            {"policy": "adaptive", "target_utilization": 0.9},
            ["batching: unknown key 'target_utilization'; did you mean 'target_utilisation'?"],
        ),
        (
            {"policy": "aimd", "latency_target": 300},
            ["batching: unknown key 'latency_target'; did you mean 'latency_target_ms'?"],
        ),
        (
            {"policy": "aimd", "max_wiat_ms": 10},
            ["batching: unknown key 'max_wiat_ms'; did you mean 'max_wait_ms'?"],
        ),
        (
            {"policy": "aimd", "name": "aimd"},  # the discriminator is policy, not a setting
            [
                "batching: unknown key 'name' (expected one of: policy, max_batch_size, "
                "max_wait_ms, max_wait_frames, preferred_batch_sizes, max_queue_frames, "
                "max_frame_age_ms, latency_target_ms)"
            ],
        ),
        (
            {"policy": "timout", "target_utilisation": 0.9},  # the policy is what is wrong
            ["batching.policy: must be 'adaptive', 'aimd', 'batch1', 'static' or 'timeout'"],
        ),
        (
            {
                "policy": "adaptive",
                "max_batch_size": 0,
                "target_utilisation": 2,
                "latency_target_ms": 1,
            },
            [
                "batching.max_batch_size: must be >= 1 (got 0)",
                "batching.target_utilisation: must be <= 1.0 (got 2)",
                f"batching.latency_target_ms: {AIMD_S}; batching.policy is adaptive",
            ],
        ),
    ],
)
def test_a_policy_setting_is_checked_against_the_chosen_policy(
    batching: dict[str, Any], expected: list[str]
):
    assert parse_errors(merged(MINIMAL, {"batching": batching})) == expected


def test_policy_choices_come_from_the_policy_modules():
    choices = BatchingConfig.model_fields["policy"].annotation.__args__
    assert choices == policy_names() == ("adaptive", "aimd", "batch1", "static", "timeout")
    assert "target_utilisation" not in BatchingConfig.model_fields  # declared in its module only


@pytest.mark.parametrize(
    "batching", [{}, {"policy": "aimd", "latency_target_ms": 300}, {"policy": "static"}]
)
def test_a_dumped_config_keeps_its_policy_settings(batching: dict[str, Any]):
    config = parse_config(merged(MINIMAL, {"batching": batching}), base_dir=BASE)
    dumped = config.model_dump(mode="json")["batching"]  # as `framebatch bench --peer` writes it
    assert {k: v for k, v in batching.items() if k != "policy"}.items() <= dumped.items()
    again = parse_config(merged(MINIMAL, {"batching": dumped}), base_dir=BASE)
    assert again.batching == config.batching
    assert again.batching.policy_options == config.batching.policy_options
    assert (
        pickle.loads(pickle.dumps(config)).batching.policy_options == config.batching.policy_options
    )


@pytest.mark.parametrize("until_done", [False, True])
def test_a_file_replayed_as_live_sheds_like_the_camera_it_stands_for(until_done: bool):
    """Paced and leaky with --until-done too, where a real-time replay waits for room."""
    from pipeline.supervisor.builders import decoder_spec

    config = parse_config(camera(url="clip.mp4", as_live=True), base_dir=BASE, environ={})
    spec = decoder_spec(config.cameras[0], default_backlog=8, until_done=until_done)
    assert spec.realtime and not spec.backpressure and not spec.live
    replay = parse_config(camera(url="clip.mp4", realtime=True), base_dir=BASE, environ={})
    assert decoder_spec(replay.cameras[0], default_backlog=8, until_done=True).backpressure


@pytest.mark.parametrize(("max_fps", "backlog"), [(None, 8), (30.0, 8), (5.0, 5), (0.5, 1)])
def test_a_sampled_live_camera_keeps_about_a_second_of_its_frames_waiting(max_fps, backlog):
    """A live camera keeps one batch waiting, or what it sends in a second if that is less (at
    least one): eight frames of a camera sampled at 0.5 fps would wait 16 s for the last one."""
    from pipeline.supervisor.builders import decoder_spec

    live = parse_config(
        camera(url="rtsp://cam.local/stream", max_fps=max_fps), base_dir=BASE, environ={}
    )
    spec = decoder_spec(live.cameras[0], default_backlog=64, until_done=False, live_backlog=8)
    assert spec.max_backlog == backlog
