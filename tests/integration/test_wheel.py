"""The wheel installs and runs (issue #21): built from a clean copy of the sources, installed
into a fresh virtual environment with the core dependencies only (no torch, no Ultralytics, no
matplotlib), where ``framebatch check-config`` and ``framebatch run --until-done`` replay a
clip generated for the test with the shared model; the tooling's commands (shipped in the
wheel, registered through the ``framebatch.commands`` entry point) print their help and name
the extra they miss.

Building needs nothing from the network (``pip wheel --no-build-isolation`` with the setuptools
installed here, when recent enough); installing takes the core dependencies from pip's
configured index (a local mirror on the build machines).  About 25 s here."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from samples.generate import SyntheticClip, encode
from tests.conftest import MODEL, REPO_ROOT

pytestmark = pytest.mark.integration

#: not sources of the wheel: what a checkout gathers beside them
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".ruff_cache", ".framebatch", "real",
)  # fmt: skip
CLIP = SyntheticClip("wheel_testsrc_320x240_5fps.mp4", "testsrc2", 320, 240, 5, 2, gop=5)


def run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # nothing of this checkout on the path: the installed wheel alone
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def build_wheel(out: Path, work: Path) -> Path:
    sources = work / "src"
    shutil.copytree(REPO_ROOT, sources, ignore=NOT_SOURCES)  # no stale build/ in the wheel
    # the setuptools here when recent enough (no download), else pip fetches one to build with
    setuptools = int(importlib.metadata.version("setuptools").split(".")[0])
    isolation = ["--no-build-isolation"] if setuptools >= 77 else []
    proc = run(
        sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", out, sources,
        cwd=work,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (wheel,) = out.glob("framebatch-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the bin/ folder of a fresh venv it is installed in)."""
    if shutil.which("redis-server") is None or shutil.which("ffmpeg") is None:
        pytest.skip("needs redis-server and ffmpeg")
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work / "dist", work)
    venv = work / "venv"
    proc = run(sys.executable, "-m", "venv", venv, cwd=work)
    assert proc.returncode == 0, proc.stderr
    proc = run(
        venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
        wheel, cwd=work,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return wheel, venv / "bin"


def test_the_wheel_holds_the_runtime_and_the_tooling_not_the_tests_or_docs(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"pipeline", "streams", "detectors", "framebatch_tools", dist_info}
    assert "pipeline/serve/web/index.html" in names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "samples/", "configs/"))]
    assert "framebatch = pipeline.cli:main" in entry_points
    assert "tools = framebatch_tools.commands:register" in entry_points
    assert "Provides-Extra: tools" in metadata


def test_the_core_install_checks_a_config_and_replays_a_clip(installed, assets, tmp_path):
    _, bin_dir = installed
    found = run(bin_dir / "python", "-c", "import pipeline, torch", cwd=tmp_path)
    assert "No module named 'torch'" in found.stderr  # the core dependencies only
    where = run(bin_dir / "python", "-c", "import pipeline; print(pipeline.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(bin_dir.parent)), where.stdout  # not this checkout's

    version = run(bin_dir / "framebatch", "--version", cwd=tmp_path)
    expected = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (version.returncode, version.stdout) == (0, f"framebatch {expected}\n"), version

    clip = encode(CLIP, tmp_path / CLIP.filename)
    config = tmp_path / "wheel.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(MODEL), "threads": 2},
                "batching": {"max_batch_size": 4, "max_wait_ms": 50},
                "cameras": [{"id": "wheel", "url": str(clip)}],
            }
        )
    )
    checked = run(bin_dir / "framebatch", "check-config", config, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    summary_path = tmp_path / "summary.json"
    ran = run(
        bin_dir / "framebatch", "run", config, "--until-done", "--http", "off",
        "--summary-json", summary_path, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["processed"] == CLIP.frames == 10
    assert summary["dropped"] == {}
    assert [c["end_reason"] for c in summary["cameras"]] == ["eof"]


def test_the_tooling_prints_its_help_and_names_the_extra_it_misses(installed, tmp_path):
    _, bin_dir = installed
    for command in ("bench", "bench-transport", "bench-gpu", "simulate", "chaos"):
        helped = run(bin_dir / "framebatch", command, "--help", cwd=tmp_path)
        assert helped.returncode == 0 and "usage: framebatch " in helped.stdout, helped.stderr
    peer = run(bin_dir / "framebatch", "bench", "--peer", "ultralytics", cwd=tmp_path)
    assert peer.returncode == 2
    assert "pip install 'framebatch[ultralytics]'" in peer.stderr
