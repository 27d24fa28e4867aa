"""The short fault-injection run: at least ten seeded faults on real parts, every frame of every
decoder session accounted for at the end, nothing of a dead daemon left behind.

Redis restarts here keep their append-only file (fsync always): a restart that empties Redis
loses what was published and not yet read by anyone, which no pipeline can account for; the
long run in docs/reliability.md measures that case too.
"""

from __future__ import annotations

import pytest

from framebatch_tools.chaos.faults import Chaos, default_cameras
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
        faults=10,
        seed=11,
        interval_s=(1.0, 2.5),
        kinds=kinds,
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
