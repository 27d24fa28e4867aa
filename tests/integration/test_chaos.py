"""The short fault-injection runs: at least ten seeded faults on real parts, every frame of every
decoder session accounted for at the end, nothing of a dead daemon left behind; and the split
roles across hosts (network namespaces) on a single Redis and a Redis Cluster, one fault of
each kind.

Redis restarts here keep their append-only file (fsync always): a restart that empties Redis
loses what was published and not yet read by anyone, which no pipeline can account for; the
long run in docs/reliability.md measures that case too.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from framebatch_tools.chaos.faults import Chaos, default_cameras
from framebatch_tools.chaos.plan import SPLIT_FAULTS, FaultPlan
from framebatch_tools.netns import netns_available
from streams.rtsp_replay import rtsp_server_available
from tests.conftest import ASSETS, MODEL, SAMPLE_CLIPS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KINDS = (
    "decoder_kill",
    "daemon_kill",
    "double_sigterm",
    "redis_restart_aof",
    "rtsp_kill",
    "rtsp_stop",
)


def test_ten_faults_lose_nothing(assets, tmp_path):
    available, _why = rtsp_server_available()
    kinds = KINDS if available else tuple(k for k in KINDS if not k.startswith("rtsp"))
    report = Chaos(
        model=MODEL,
        cameras=default_cameras(ASSETS, SAMPLE_CLIPS),
        rtsp_clip=SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4" if available else None,
        plan=FaultPlan(10, 11, (1.0, 2.5), kinds),
        workdir=tmp_path / "chaos",
    ).run()
    print(report.format())
    assert len(report.faults) == 10
    assert [f.leftovers for f in report.faults] == [[]] * 10
    assert all(f.recovered_s is not None for f in report.faults), report.format()
    assert report.unaccounted == 0, report.format()
    for camera in report.cameras:
        assert camera["detected_and_dropped"] == 0, camera
        assert camera["detected"] > 0, camera
    assert {f.kind for f in report.faults} == set(kinds)  # every kind, in a seeded order


@pytest.mark.parametrize("redis_kind", ["single", "cluster"])
def test_a_fault_of_each_kind_on_the_split_roles_loses_nothing(tmp_path, redis_kind):
    """``framebatch chaos --topology split``, as a process (it moves onto the Redis host's
    network): a decode and a detect worker SIGKILLed, a host cut off, Redis (a master)
    crashed and restarted, a camera removed and added back; every camera's frames flow again
    after each, and every frame is detected or dropped with a cause."""
    available, why = netns_available()
    if not available:
        pytest.skip(why)
    output = tmp_path / "split.json"
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pipeline.cli", "chaos", "--topology", "split"),
            *("--redis", redis_kind, "--faults", str(len(SPLIT_FAULTS)), "--seed", "3"),
            *("--interval", "1", "2", "--cameras", "6"),
            *("--workdir", str(tmp_path / "work"), "--output", str(output)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads(output.read_text())
    assert sorted(f["kind"] for f in report["faults"]) == sorted(SPLIT_FAULTS)
    assert report["survived"] == len(SPLIT_FAULTS), run.stdout
    assert report["unaccounted"] == 0, run.stdout
    for camera in report["cameras"]:
        assert camera["detected_and_dropped"] == 0, camera
        assert camera["detected"] > 0 and camera["sessions"] >= 1, camera
