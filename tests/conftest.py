"""Shared fixtures: the shared test assets and a real redis-server on a free loopback port."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streams.embedded_redis import EmbeddedRedis, free_tcp_port

REPO_ROOT = Path(__file__).resolve().parents[1]
ASSETS = REPO_ROOT.parent / "shared" / "assets"
MODEL = ASSETS / "models" / "yolov8n_fp32_dynbatch.onnx"
#: The same weights exported by Ultralytics with a dynamic height and width (rect inference).
MODEL_ANY_SIZE = ASSETS / "models" / "yolov8n-coco_ultralytics_dynamic.onnx"
VIDEOS = ASSETS / "videos"
REFERENCE = ASSETS / "reference" / "yolov8n_fp32_detections.json"
SAMPLE_CLIPS = REPO_ROOT / "samples" / "clips"

_prefixes = itertools.count()
_users = itertools.count()


@pytest.fixture(scope="session")
def assets() -> Path:
    """The shared model and clips (``../shared/assets``); skip when they are absent."""
    if not MODEL.is_file() or not VIDEOS.is_dir():
        pytest.skip(f"shared test assets not found at {ASSETS}")
    return ASSETS


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server for the whole test session, on a free port of 127.0.0.1."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with EmbeddedRedis(port=free_tcp_port()) as server:
        yield server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def prefix() -> str:
    """A key prefix of its own for each test, so tests sharing the server never collide."""
    return f"test{next(_prefixes)}"


@pytest.fixture(scope="module")
def redis_client_module(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def acl_user(redis_client):
    """Makes a Redis ACL user with the given rules (password ``pw``); removed after the test."""
    names = []

    def make(*rules: str) -> tuple[str, str]:
        name = f"fbtest{next(_users)}-{os.getpid()}"
        redis_client.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", *rules)
        names.append(name)
        return name, "pw"

    yield make
    for name in names:
        redis_client.execute_command("ACL", "DELUSER", name)
