"""Offline, without an assets folder: ``python -m samples.clips fetch``, ``framebatch models
fetch`` and ``make demo`` fail within seconds, in a few short lines that say what is missing,
where it was looked for and why there, how to point elsewhere, and the command that fetches
once online (issue #21).  "Offline" is a closed port on 127.0.0.1 as the mirror or the proxy:
nothing here reaches the internet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.errors import EXIT_BAD_INPUT, EXIT_RUN_FAILED
from streams.embedded_redis import free_tcp_port
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration

MAX_SECONDS = 10
MAX_LINES = 6


def offline_env(home: Path, **extra: str) -> dict[str, str]:
    """A user with an empty home (so an empty cache) and no proxy or assets of the caller's."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.lower().endswith("_proxy")
        and key not in ("FRAMEBATCH_CACHE", "XDG_CACHE_HOME", "FRAMEBATCH_ASSETS")
        and not key.startswith("FRAMEBATCH_MODEL_MIRROR")
    }
    return {**env, "HOME": str(home), **extra}


def run(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - began


@pytest.mark.parametrize("via", ["flag", "environment"])
def test_clips_fetch_offline_says_where_it_looked_and_what_to_do(tmp_path, via):
    nowhere = tmp_path / "no-assets"
    dead = f"127.0.0.1:{free_tcp_port()}"
    env = offline_env(tmp_path, **({"FRAMEBATCH_ASSETS": str(nowhere)} if via != "flag" else {}))
    assets = ["--assets", str(nowhere)] if via == "flag" else []
    command = [sys.executable, "-m", "samples.clips", "fetch", "--dest", str(tmp_path / "real")]
    proc, seconds = run([*command, *assets, "--mirror", f"http://{dead}/clips"], env)
    assert proc.returncode == EXIT_RUN_FAILED, proc.stderr
    assert seconds < MAX_SECONDS
    lines = proc.stderr.strip().splitlines()
    origin = "--assets" if via == "flag" else "$FRAMEBATCH_ASSETS"
    assert len(lines) <= MAX_LINES, proc.stderr
    missing = f"4 of 4 sample clips missing in {tmp_path}/real"
    assert lines[0] == f"python -m samples.clips fetch: {missing}"
    assert f"looked in: {nowhere}/videos (from {origin}: no such folder)" in proc.stderr
    assert f"{dead} unreachable (Connection refused); nothing more downloaded" in proc.stderr
    assert "--assets PATH or FRAMEBATCH_ASSETS=PATH" in proc.stderr
    assert lines[-1] == "  fetch when online: python -m samples.clips fetch"
    assert proc.stdout.count("download ") == 1  # one try, not one per clip


def test_clips_fetch_without_downloads_is_bad_input(tmp_path):
    env = offline_env(tmp_path, FRAMEBATCH_ASSETS=str(tmp_path / "no-assets"))
    command = [sys.executable, "-m", "samples.clips", "fetch", "--dest", str(tmp_path / "real")]
    proc, seconds = run([*command, "--no-download"], env)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert seconds < MAX_SECONDS
    assert "not downloaded: downloads are off (--no-download)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("download", [True, False])
def test_models_fetch_offline_says_where_it_looked_and_what_to_do(tmp_path, download):
    nowhere = tmp_path / "no-assets"
    dead = f"127.0.0.1:{free_tcp_port()}"
    env = offline_env(tmp_path, FRAMEBATCH_ASSETS=str(nowhere))
    how = ["--mirror", f"http://{dead}/weights"] if download else ["--no-download"]
    proc, seconds = run(
        [sys.executable, "-m", "pipeline.cli", "models", "fetch", "yolov8n", *how], env
    )
    assert proc.returncode == (EXIT_RUN_FAILED if download else EXIT_BAD_INPUT), proc.stderr
    assert seconds < MAX_SECONDS
    cache = tmp_path / ".cache" / "framebatch" / "models"
    shared_onnx = "models/yolov8n-coco_ultralytics_dynamic.onnx"
    why = (
        f"download failed: {dead} unreachable (Connection refused)"
        if download
        else "not downloaded: downloads are off (--no-download)"
    )
    assert proc.stderr.strip().splitlines() == [
        f"framebatch models fetch: yolov8n is not in the cache {cache}",
        f"  looked in: {nowhere}/{shared_onnx} (from $FRAMEBATCH_ASSETS: no such folder)",
        f"  {why}",
        "  point elsewhere: --assets PATH, FRAMEBATCH_ASSETS=PATH, or model.path: FILE.onnx in "
        "the config",
        "  fetch when online: framebatch models fetch yolov8n",
    ]
    assert list(cache.iterdir()) == []  # nothing half-downloaded


def test_make_demo_offline_fails_fast_and_says_it_once(tmp_path):
    """``make demo`` (its setup taken as done) with no assets and a dead proxy: whichever fetch
    comes first fails, once, and make stops there."""
    if shutil.which("make") is None or not (REPO_ROOT / ".venv" / "bin" / "python").is_file():
        pytest.skip("needs make and the project's .venv")
    proxy = f"http://127.0.0.1:{free_tcp_port()}"
    env = offline_env(
        tmp_path,
        FRAMEBATCH_ASSETS=str(tmp_path / "no-assets"),
        http_proxy=proxy,
        https_proxy=proxy,
    )
    proc, seconds = run(["make", "--no-print-directory", "-o", "setup", "demo"], env)
    assert proc.returncode != 0
    assert seconds < MAX_SECONDS
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= MAX_LINES + 1, proc.stderr  # and make's own "*** [demo] Error 3"
    assert proc.stderr.count("fetch when online: ") == 1, proc.stderr
    assert "(from $FRAMEBATCH_ASSETS: no such folder)" in proc.stderr
    assert f"the proxy {proxy[7:]} ($https_proxy) unreachable" in proc.stderr
    assert "samples.demo" not in proc.stdout  # stopped before the demo
