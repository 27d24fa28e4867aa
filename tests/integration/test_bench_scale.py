"""The scale benchmark runs end to end (real worker processes and Redis, simulated model): a
short window, so it checks the tool works and the workers share the load, not the figures
(those are docs/benchmarks.md's)."""

from __future__ import annotations

import json

import pytest

from framebatch_tools.bench import scale as bench_scale

pytestmark = pytest.mark.integration


def test_two_workers_both_publish_and_the_report_is_written(tmp_path, capsys):
    report_path = tmp_path / "scale.json"
    argv = ["--workers", "1,2", "--rounds", "1", "--window", "2", "--json", str(report_path)]
    assert bench_scale.main([*argv, "--redis", "single,cluster"]) == 0
    report = json.loads(report_path.read_text())
    for runs in (report["runs"], report["cluster_runs"]):  # a single Redis, a Redis Cluster
        one, two = runs["1"]["median"], runs["2"]["median"]
        assert one > 0 and two > one  # a second worker adds throughput (sleeping detectors)
    assert "not CPU bound" in capsys.readouterr().out
