"""The GPU check's verdict: a missed or unmeasured target fails it (issue #12)."""

from __future__ import annotations

from framebatch_tools.bench.gpu import missed_targets


def test_missed_and_unmeasured_targets_are_named() -> None:
    result = {
        "targets": {
            "batching_vs_batch1": {"target": 3.0, "measured": 4.2, "pass": True},
            "double_vs_single": {"target": 1.2, "measured": 1.05, "pass": False},
            "pipeline_vs_raw": {"target": 0.9, "measured": None, "pass": False},
        }
    }
    assert missed_targets(result) == [
        "double_vs_single: 1.05, target >= 1.2",
        "pipeline_vs_raw: not measured, target >= 0.9",
    ]


def test_all_targets_met_is_no_miss() -> None:
    met = {"target": 3.0, "measured": 3.0, "pass": True}
    assert missed_targets({"targets": {"batching_vs_batch1": met}}) == []
