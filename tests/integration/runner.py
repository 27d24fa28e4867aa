"""Run ``framebatch`` as a user would (a subprocess) on a config written for the test."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import yaml

from pipeline.leases.camera_leases import rendezvous_owner
from streams.keys import StreamKeys
from streams.messages import DetectionMessage


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    summary: dict[str, Any] | None


def write_config(
    path: Path,
    *,
    model: Path,
    cameras: list[dict[str, Any]],
    redis_url: str | None,
    prefix: str = "fb",
    max_batch_size: int = 8,
    max_wait_ms: float = 50,
    batching_extra: dict[str, Any] | None = None,
    **sections: Any,
) -> Path:
    config: dict[str, Any] = {
        "model": {"path": str(model), "threads": 2},
        "batching": {
            "max_batch_size": max_batch_size,
            "max_wait_ms": max_wait_ms,
            **(batching_extra or {}),
        },
        "cameras": cameras,
        "redis": {"prefix": prefix, **({"url": redis_url} if redis_url else {})},
        # any free port: daemons of several tests (or a developer's own) never collide
        "http": {"listen": "127.0.0.1:0"},
        **sections,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def framebatch(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def start_daemon(
    config: Path, *args: str, command: str = "run", own_group: bool = False
) -> subprocess.Popen[str]:
    """``framebatch COMMAND CONFIG ARGS...`` in the background, its output captured;
    ``own_group``: in a process group of its own (``os.killpg`` takes its children too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", command, str(config), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
    )


def stop_daemon(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """SIGTERM, as a user's Ctrl-C or a service manager would; killed after 60 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def even_pair(cameras: list[str], stem: str) -> tuple[str, str]:
    """Two worker names (``<stem>-<i>``) that rendezvous hashing gives half the cameras each."""
    return next(
        (a, b)
        for a, b in ((f"{stem}-{i}", f"{stem}-{i + 1}") for i in range(100))
        if 2 * sum(rendezvous_owner(c, (a, b)) == a for c in cameras) == len(cameras)
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.05, describe=None):
    """``condition()``'s first true value; AssertionError naming ``what`` after the timeout,
    with ``describe()`` (what the wait saw last) when given."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    seen = f"\n{describe()}" if describe is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{seen}")


def run_until_done(config: Path, timeout: float = 900) -> CliResult:
    summary_path = config.with_suffix(".summary.json")
    proc = framebatch(
        "run", str(config), "--until-done", "--summary-json", str(summary_path), timeout=timeout
    )
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return CliResult(proc.returncode, proc.stdout, proc.stderr, summary)


def published(client: redis.Redis, prefix: str, camera: str) -> list[DetectionMessage]:
    """Every detection message of a camera, in stream order."""
    entries = client.xrange(StreamKeys(prefix).detections(camera))
    return [DetectionMessage.from_fields(fields) for _id, fields in entries]
