"""``framebatch simulate`` writes where the user says, else into a new temporary folder it
prints (never into the checkout), and names the ``sim`` extra when matplotlib is missing."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

from framebatch_tools.simulate import sweep
from pipeline.cli import build_parser


@pytest.fixture
def small_sweep(monkeypatch):
    """One CPU profile, a few hundred frames a point: the command's paths, not its figures."""
    monkeypatch.setattr(sweep, "QUICK_FRAME_BUDGET", 300)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plots: faster, and the hint


def simulate(*argv: str) -> int:
    args = build_parser().parse_args(
        ["simulate", "--quick", "--profile", "cpu_ort_2core", "--jobs", "1", "--seconds", "2"]
        + list(argv)
    )
    return args.handler(args)


def test_by_default_it_writes_into_a_new_temp_folder_it_prints(
    small_sweep, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert simulate() == 0
    out = capsys.readouterr().out
    folders = list((tmp_path / "tmp").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith("framebatch-simulate-")
    assert f"writing the CSV and plots to {folders[0]}" in out.splitlines()[0]
    assert (folders[0] / "batching_quick_sweep.csv").is_file()
    assert not (tmp_path / "docs").exists()  # nothing where it was run


def test_out_names_the_folder_and_the_hint_names_the_sim_extra(small_sweep, tmp_path, capsys):
    assert simulate("--out", str(tmp_path / "sim")) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "sim" / "batching_quick_sweep.csv").is_file()
    assert "matplotlib is not installed: no plots (pip install 'framebatch[tools]')" in out


def test_jobs_default_to_the_cpus_this_process_may_use():
    assert sweep.usable_cpus() == len(os.sched_getaffinity(0))
