"""Nothing outlives the daemon: SIGKILL of the daemon alone, or a second SIGTERM, takes its
decoders, its private redis-server, that server's folder and the shm rings with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from streams.keys import StreamKeys
from streams.rtsp_replay import rtsp_server_available, serve_rtsp
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import write_config
from tests.integration.test_transports import segments, wait_for

pytestmark = pytest.mark.integration


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, read from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        children = {child for child, parent in parents.items() if parent in frontier}
        frontier = children - found
        found |= children
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (zombies waiting for init count as gone)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def redis_workdirs(owner: int) -> list[Path]:
    found = []
    for workdir in Path(tempfile.gettempdir()).glob("framebatch-redis-*"):
        try:
            if int((workdir / "owner.pid").read_text()) == owner:
                found.append(workdir)
        except (OSError, ValueError):
            continue
    return found


def start_daemon(tmp_path: Path, prefix: str) -> subprocess.Popen[str]:
    """A daemon with a private redis-server, shm transport and two looping cameras."""
    looping = {"realtime": True, "loop": True, "fps": 10}
    config = write_config(
        tmp_path / "daemon.yaml",
        model=MODEL,
        cameras=[
            {"id": "bars", "url": str(SAMPLE_CLIPS / "bars_320x240_5fps.mp4"), **looping},
            {"id": "testsrc", "url": str(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"), **looping},
        ],
        redis_url=None,
        prefix=prefix,
        transport={"kind": "shm"},
    )
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def running_tree(daemon: subprocess.Popen[str], prefix: str) -> set[int]:
    """Wait until both decoders write their rings and the model had time to load."""
    wait_for(lambda: len(segments(prefix)) == 2, 60, "both decoders' rings")
    wait_for(lambda: redis_workdirs(daemon.pid), 10, "the private redis-server's folder")
    time.sleep(3.0)  # frames flowing through the batcher
    tree = descendants(daemon.pid)
    assert len(tree) >= 4, tree  # two decoders, the redis guard and redis-server
    return tree


def assert_nothing_left(daemon: subprocess.Popen[str], tree: set[int], prefix: str) -> None:
    wait_for(lambda: not alive(tree), 15, f"the daemon's children {alive(tree)} to exit")
    wait_for(lambda: not segments(prefix), 10, "the shm rings' removal")
    wait_for(lambda: not redis_workdirs(daemon.pid), 10, "the redis folder's removal")


def test_sigkill_of_the_daemon_takes_everything_with_it(assets, tmp_path, prefix):
    daemon = start_daemon(tmp_path, prefix)
    try:
        tree = running_tree(daemon, prefix)
        daemon.kill()
        daemon.wait(timeout=10)
        assert_nothing_left(daemon, tree, prefix)
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.communicate()


def test_a_second_sigterm_exits_at_once_and_leaves_nothing(assets, tmp_path, prefix):
    daemon = start_daemon(tmp_path, prefix)
    try:
        tree = running_tree(daemon, prefix)
        daemon.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        assert daemon.returncode == 128 + signal.SIGTERM
        assert_nothing_left(daemon, tree, prefix)
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.communicate()


def test_a_stale_redis_folder_of_a_dead_owner_is_swept(tmp_path):
    from streams.embedded_redis import OWNER_FILE, sweep_stale_workdirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / "framebatch-redis-stale"
    stale.mkdir()
    (stale / OWNER_FILE).write_text(str(dead.pid))
    live = tmp_path / "framebatch-redis-live"
    live.mkdir()
    (live / OWNER_FILE).write_text(str(os.getpid()))
    assert sweep_stale_workdirs(tmp_path) == [stale]
    assert live.is_dir() and not stale.exists()


@pytest.fixture
def rtsp_url(assets):
    available, why = rtsp_server_available()
    if not available:
        pytest.skip(why)
    with serve_rtsp(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4") as url:
        yield url


def test_a_graceful_stop_reads_how_each_camera_ended(
    assets, rtsp_url, redis_url, redis_client, tmp_path, prefix
):
    """SIGTERM: each decoder writes its end entry and the workers read on up to it, so the
    summary says how every camera ended (it said "(running)": the end entries stayed unread
    in the frames streams) and its counts add up with nothing in flight."""
    summary_path = tmp_path / "summary.json"
    config = write_config(
        tmp_path / "graceful.yaml",
        model=MODEL,
        cameras=[
            {
                "id": "paced",
                "url": str(SAMPLE_CLIPS / "bars_320x240_5fps.mp4"),
                "realtime": True,
                "loop": True,
                "fps": 10,
            },
            {"id": "live", "url": rtsp_url},
        ],  # fmt: skip
        redis_url=redis_url,
        prefix=prefix,
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "run", str(config), "--summary-json",
         str(summary_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    keys = StreamKeys(prefix)
    try:
        for camera in ("paced", "live"):
            wait_for(
                lambda camera=camera: redis_client.xlen(keys.detections(camera)) >= 3,
                120,
                f"detections of {camera}",
            )
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.communicate()
    assert daemon.returncode == 0, stderr
    summary = json.loads(summary_path.read_text())
    for camera in summary["cameras"]:
        assert camera["end_reason"] == "stopped", camera
        dropped = sum(camera["dropped"].values())
        assert camera["decoded"] == camera["processed"] + dropped, camera
        assert camera["in_flight"] == 0, camera
    for camera in ("paced", "live"):  # nothing left in the streams for the next run
        assert redis_client.xlen(keys.frames(camera)) == 0, camera


def test_two_signals_while_the_model_loads_exit_at_once(assets, tmp_path, prefix):
    """The model loads in one long call into ONNX Runtime, during which Python runs no signal
    handler: two SIGTERMs then ran it once (a graceful stop, the second lost). Counted from the
    interpreter's wakeup pipe, the second exits at once."""
    daemon = start_daemon(tmp_path, prefix)
    try:
        assert daemon.stderr is not None
        for line in daemon.stderr:  # the HTTP endpoint serves: the model load comes next
            if "http:" in line:
                break
        daemon.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        assert daemon.returncode == 128 + signal.SIGTERM
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.communicate()
