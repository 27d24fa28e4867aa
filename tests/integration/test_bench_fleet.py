"""The fleet benchmark, short (``framebatch_tools.bench.fleet``): cameras from the registry
over two decode and two detect workers on hosts of their own (network namespaces), on a Redis
Cluster; a camera removed and added back through the registry; a decode host cut off for 5 s
and another SIGKILLed: their cameras back on other hosts, and every frame of every session
detected or dropped with a cause, none after its session's end.

On the cluster only (42 s; both took CI 80 s): a single Redis is the simpler of the two for the
same code, and its decode hosts cut off and killed are test_several_hosts.py's and
test_chaos.py's.

Run as a process: the benchmark moves itself onto the Redis host's network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from framebatch_tools.netns import netns_available

pytestmark = pytest.mark.integration

CAMERAS = 24


def test_a_small_fleet_shares_its_cameras_and_loses_nothing_to_a_lost_decode_host(tmp_path):
    available, why = netns_available()
    if not available:
        pytest.skip(why)
    figures = tmp_path / "fleet.json"
    run = subprocess.run(
        [
            *(sys.executable, "-m", "framebatch_tools.bench.fleet"),
            *("--cameras", str(CAMERAS), "--hosts", "2", "--fps", "2", "--window", "3"),
            *("--changes", "1", "--redis", "cluster", "--faults"),
            *("--json", str(figures), "--logs", str(tmp_path / "logs")),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    runs = json.loads(figures.read_text())
    measured = [r for r in runs if not r["faults"]]
    faulted = [r for r in runs if r["faults"]]
    assert [r["redis"] for r in measured] == [r["redis"] for r in faulted] == ["cluster"]
    for fleet in measured:
        assert fleet["cameras_placed"] == CAMERAS and fleet["frames_per_s"] > 0, fleet
        assert fleet["redis_calls_per_frame"] > 0, fleet
        for name in ("removed_until_retired_s", "added_until_detected_s"):
            assert len(fleet["propagation"][name]) == 1, fleet  # the camera came back
    for fleet in faulted:
        faults = fleet["faults"]
        for fault in ("cut_5s", "sigkill"):
            assert faults[fault]["cameras"] > 0, faults
            # back at all (the run waits LEASE_TTL_S + 30 s at most); how soon is the
            # benchmark's figure, not this test's: a slow machine must not fail it
            assert faults[fault]["reopened_s"] >= faults[fault]["leases_taken_s"] > 0, faults
        audit = faults["audit"]
        assert audit["unaccounted"] == 0 and audit["not_ok"] == [], audit
        assert audit["after_session_end"] == 0, audit
        assert audit["frames"] == audit["detected"] + sum(audit["dropped"].values()), audit
        assert audit["detected"] > 0, audit
        # the cut one's, the killed one's: a session ended elsewhere, a new one opened
        assert audit["sessions"] > CAMERAS, audit
