"""``framebatch export`` without its optional libraries: one line naming the extra, exit 2.

This venv has torch, onnx and ultralytics; a library is made missing the way Python reports one
that is not installed: ``sys.modules[name] = None`` makes ``import name`` raise
``ModuleNotFoundError`` with ``name`` set.  The subprocess test does the same from outside, with
a package on PYTHONPATH that raises on import, and checks there is no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main

PT_LINE = (
    "framebatch export: reading a .pt needs the ultralytics extra: "
    "pip install 'framebatch[ultralytics]'"
)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "x.pt"
    path.write_bytes(b"PK\x03\x04 not really a checkpoint")
    return path


@pytest.mark.parametrize(
    ("missing", "fmt"), [("torch", "onnx"), ("onnx", "onnx"), ("torch", "torchscript")]
)
def test_a_pt_without_the_extra_is_one_line(monkeypatch, capsys, checkpoint, missing, fmt):
    monkeypatch.setitem(sys.modules, missing, None)
    assert main(["export", str(checkpoint), "--format", fmt]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(PT_LINE) and captured.err.count("\n") == 1
    assert captured.out == ""


def test_a_missing_module_of_the_project_is_a_bug_not_an_extra(monkeypatch, checkpoint):
    monkeypatch.setitem(sys.modules, "detectors.device.checkpoint", None)
    with pytest.raises(ModuleNotFoundError):
        main(["export", str(checkpoint), "--format", "torchscript"])


def test_the_command_line_without_torch_prints_no_traceback(tmp_path, checkpoint):
    shim = tmp_path / "shim" / "torch"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "export", str(checkpoint), "--format", "onnx"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(shim.parent), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(PT_LINE) and "Traceback" not in proc.stderr
