"""Bad input at start: one clear line, exit 2, no traceback, bounded time (real redis-server)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from pipeline.fleet.registry import CameraRegistry
from streams.keys import StreamKeys
from tests.acl_rules import DAEMON_RULES, DECODE_RULES, DETECT_RULES, REGISTRY_RULES
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import framebatch, write_config

pytestmark = pytest.mark.integration

CLIP = SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"


def _one_clear_line(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("framebatch")]
    assert len(lines) == 1, proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def one_camera_config(tmp_path, assets, redis_url: str | None, **sections) -> Path:
    return write_config(
        tmp_path / "c.yaml",
        model=assets / "models" / "yolov8n_fp32_dynbatch.onnx",
        cameras=[{"id": "a", "url": str(CLIP)}],
        redis_url=redis_url,
        **sections,
    )


def as_user(redis_url: str, user: str, password: str) -> str:
    where = urlsplit(redis_url)
    return f"redis://{user}:{password}@{where.hostname}:{where.port}/0"


def wait_for_lease(redis_url: str, key: str, worker: subprocess.Popen[str]) -> redis.Redis:
    """Until the detector worker holds the camera's lease (a client to look further)."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 90
    while client.get(key) is None and time.monotonic() < deadline:
        assert worker.poll() is None, worker.communicate()[1]
        time.sleep(0.2)
    assert client.get(key) is not None
    return client


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"hello, I am text\n", "is not an ONNX model", id="text"),
        pytest.param(b"", "is empty", id="empty"),
        pytest.param(
            b"\x08\x09garbage that is no protobuf" * 10,
            "ONNX Runtime cannot load",
            id="bad-protobuf",
        ),
    ],
)
def test_a_model_file_that_is_not_a_model_is_one_line(tmp_path, content, expected):
    model = tmp_path / "x.onnx"
    model.write_bytes(content)
    config = write_config(
        tmp_path / "c.yaml", model=model, cameras=[{"id": "a", "url": str(CLIP)}], redis_url=None
    )
    _one_clear_line(framebatch("run", str(config), "--until-done", timeout=120), "x.onnx", expected)


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        pytest.param(("~*", "+@all", "-time"), "may not run TIME", id="no-TIME"),
        pytest.param(("~*", "+@all", "-del"), "may not run DEL", id="no-DEL"),
        pytest.param(("~*", "+@all", "-xclaim"), "may not run XCLAIM", id="no-XCLAIM"),
        pytest.param(("~other:*", "+@all"), "may not run XADD on", id="other-prefix"),
    ],
)
def test_an_acl_denial_names_the_command(
    redis_url, acl_user, prefix, tmp_path, assets, rules, expected
):
    user, password = acl_user(*rules)
    config = one_camera_config(tmp_path, assets, as_user(redis_url, user, password), prefix=prefix)
    line = _one_clear_line(framebatch("run", str(config), "--until-done", timeout=120), expected)
    assert password not in line.replace("pw ", "")  # the URL is shown redacted


@pytest.mark.parametrize(
    ("granted", "denied"),
    [
        ("documented", None),
        ("registry", "may not run EVALSHA (worker heartbeat)"),
        ("daemon", "may not run EVALSHA (camera registry: a change)"),
    ],
    ids=["decode-rules", "registry-rules-only", "daemon-rules-only"],
)
def test_a_decode_worker_on_a_shared_redis_checks_its_registry_and_lease_commands_at_start(
    redis_url, acl_user, prefix, tmp_path, assets, granted, denied
):
    rules = [f"~{prefix}:*", *DAEMON_RULES]
    rules += REGISTRY_RULES if granted != "daemon" else []
    rules += DECODE_RULES if granted == "documented" else []
    user, password = acl_user(*rules)
    config = one_camera_config(tmp_path, assets, as_user(redis_url, user, password), prefix=prefix)
    proc = framebatch("decode", str(config), "--http", "off", timeout=120)
    if denied:
        _one_clear_line(proc, denied)
        return
    assert proc.returncode == 0, proc.stderr[-3000:]  # its file decoded, the registry seeded
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(CameraRegistry(client, StreamKeys(prefix)).cameras()) == ["a"]
        assert not client.keys(f"{prefix}:probe:*")  # the probe's keys, registry's too, gone
    finally:
        client.close()


def test_rediss_against_a_plain_port_names_tls(redis_url, tmp_path, assets):
    where = urlsplit(redis_url)
    config = write_config(
        tmp_path / "c.yaml",
        model=assets / "models" / "yolov8n_fp32_dynbatch.onnx",
        cameras=[{"id": "a", "url": str(CLIP)}],
        redis_url=f"rediss://{where.hostname}:{where.port}/0",
    )
    started = time.monotonic()
    proc = framebatch("run", str(config), "--until-done", timeout=120)
    _one_clear_line(proc, "rediss:// needs a TLS port")
    assert time.monotonic() - started < 60


def test_consume_takes_the_url_from_the_environment_or_a_file(redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url)
    client.execute_command("ACL", "SETUSER", "fbconsume", "reset", "on", ">s3cret", "~*", "+@all")
    try:
        where = urlsplit(redis_url)
        url = f"redis://fbconsume:s3cret@{where.hostname}:{where.port}/0"
        command = [sys.executable, "-m", "pipeline.cli", "consume", "--timeout", "0.5"]
        env = {**os.environ, "FRAMEBATCH_REDIS_URL": url}
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        url_file = tmp_path / "redis-url"
        url_file.write_text(url + "\n")
        proc = framebatch("consume", "--redis-file", str(url_file), "--timeout", "0.5")
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        # on the command line it still works, with a warning that ps shows it
        proc = framebatch("consume", "--redis", url, "--timeout", "0.5")
        assert proc.returncode == 0 and "visible to other users in ps" in proc.stderr
        # a wrong password is one line, without the password
        bad = url.replace("s3cret", "wrong-pw")
        proc = framebatch("consume", "--redis", bad, "--timeout", "0.5")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "wrong-pw" not in proc.stderr.split("visible")[-1]
    finally:
        client.execute_command("ACL", "DELUSER", "fbconsume")
        client.close()


@pytest.mark.parametrize("documented", [True, False], ids=["detect-rules", "daemon-rules-only"])
def test_a_detector_worker_checks_its_lease_commands_at_start(
    redis_url, acl_user, prefix, tmp_path, assets, documented
):
    rules = [f"~{prefix}:*", *DAEMON_RULES, *REGISTRY_RULES]
    rules += DETECT_RULES if documented else []
    user, password = acl_user(*rules)
    config = one_camera_config(tmp_path, assets, as_user(redis_url, user, password), prefix=prefix)
    if not documented:
        proc = framebatch("detect", str(config), "--http", "off", timeout=120)
        # a command of the script denied: Redis names the script, not the command
        _one_clear_line(proc, "may not run EVALSHA (worker heartbeat)", "can't run this command")
        return
    # with the documented rules it starts, takes its camera and stops cleanly on SIGTERM
    worker = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "detect", str(config), "--http", "off"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = wait_for_lease(redis_url, StreamKeys(prefix).lease("a"), worker)
    finally:
        worker.terminate()
        _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert client.get(StreamKeys(prefix).lease("a")) is None  # let go on the way out


def test_decoders_alone_exit_1_when_a_camera_failed(
    redis_url, redis_client, prefix, tmp_path, assets
):
    """``framebatch decode`` knows its cameras' ends from their decoders: a source that failed
    makes it exit 1, like ``framebatch run`` (the other camera is decoded to its end)."""
    config = write_config(
        tmp_path / "decode.yaml",
        model=MODEL,
        cameras=[
            {"id": "good", "url": str(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4")},
            {"id": "notvideo", "url": str(SAMPLE_CLIPS / "not_a_video.mp4")},
        ],
        redis_url=redis_url,
        prefix=prefix,
    )
    proc = framebatch("decode", str(config), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "camera 'notvideo'" in proc.stderr and "Traceback" not in proc.stderr
    good = redis_client.xlen(StreamKeys(prefix).frames("good"))
    assert good == 60 + 1  # every frame and the session's end, waiting for a detector worker


@pytest.mark.parametrize("role", ["decode", "detect"])
def test_split_roles_need_the_shared_redis_url(tmp_path, assets, role):
    config = one_camera_config(tmp_path, assets, None)
    _one_clear_line(framebatch(role, str(config), timeout=60), f"framebatch {role} needs redis.url")


def test_a_second_worker_under_a_running_workers_id_is_refused(redis_url, prefix, tmp_path, assets):
    config = one_camera_config(
        tmp_path,
        assets,
        redis_url,
        prefix=prefix,
        redis={"url": redis_url, "prefix": prefix, "lease_ttl_s": 1.0},
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "detect", str(config), "--http", "off"]
        + ["--worker-id", "gpu-0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_lease(redis_url, StreamKeys(prefix).lease("a"), first)
        proc = framebatch("detect", str(config), "--http", "off", "--worker-id", "gpu-0")
        _one_clear_line(proc, "worker id 'gpu-0' is in use")
    finally:
        first.terminate()
        first.communicate(timeout=60)
    assert first.returncode == 0
