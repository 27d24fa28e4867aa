"""Redis killed and started again mid-run, with and without persistence: the daemon rides it
out, a consumer reconnects, and every decoded frame has its detections or a counted drop."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from framebatch_tools.audit import audit
from streams.consumer import DetectionConsumer
from streams.embedded_redis import EmbeddedRedis, free_tcp_port
from streams.keys import StreamKeys
from streams.messages import message_kind
from streams.redis_connect import connect
from streams.rtsp_replay import rtsp_server_available, serve_rtsp
from tests.conftest import MODEL, SAMPLE_CLIPS, VIDEOS
from tests.integration.runner import framebatch, write_config
from tests.integration.test_transports import wait_for

pytestmark = pytest.mark.integration

CLIP = SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"  # 60 frames


class Collector:
    """A consumer that reads every detection while the run goes on (Redis restarts too)."""

    def __init__(self, url: str, prefix: str):
        self._client = connect(url, reconnect_timeout_s=60)
        self._consumer = DetectionConsumer(
            self._client, StreamKeys(prefix), from_start=True, dedupe=False, block_ms=100
        )
        self.messages: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.messages(timeout_s=0.2):
                self.messages.append(message)

    def stop(self) -> list:
        time.sleep(1.0)  # the last messages
        self._stop.set()
        self._thread.join(10)
        self._client.close()
        return self.messages


@pytest.fixture(scope="module")
def rtsp_camera(assets):
    available, why = rtsp_server_available()
    if not available:
        pytest.skip(why)
    with serve_rtsp(VIDEOS / "highway_traffic_960x540_30fps.mp4") as url:
        yield url


def file_ended_unread(url: str, prefix: str) -> bool:
    """The file camera's decoder has written its end entry, which no reader took yet."""
    with connect(url, reconnect_timeout_s=0) as client:
        entries = client.xrange(StreamKeys(prefix).frames("file"))
    return any(message_kind(fields) == "end" for _id, fields in entries)


@pytest.mark.parametrize(
    ("persistent", "lost"),
    [(True, "while-decoding"), (False, "while-decoding"), (False, "after-the-file-ended")],
    ids=["aof", "no-persistence", "no-persistence-after-the-file-ended"],
)
def test_the_daemon_rides_out_a_redis_restart(assets, rtsp_camera, tmp_path, persistent, lost):
    """Redis is killed at a chosen point, not a lucky one: while the file camera is still being
    decoded (paced: 60 frames take 12 s), or once its decoder has finished and its end entry
    waits unread in the stream (not paced: decoding outruns the detector by far).  Without
    persistence the second loses the end entry; the supervisor, which knows how the session
    ended, writes it again, so the replay ends (it waited for ever) and adds up."""
    port = free_tcp_port()
    aof_dir = tmp_path / "aof" if persistent else None
    if aof_dir is not None:
        aof_dir.mkdir()
    server = EmbeddedRedis(port=port, aof_dir=aof_dir).start()
    url = server.url
    paced = lost == "while-decoding"
    file_camera = {"id": "file", "url": str(CLIP), "realtime": paced, "fps": 5 if paced else None}
    config = write_config(
        tmp_path / "outage.yaml",
        model=MODEL,
        cameras=[
            {key: value for key, value in file_camera.items() if value is not None},
            {"id": "live", "url": rtsp_camera},
        ],
        redis_url=url,
        prefix="outage",
        redis={"url": url, "prefix": "outage", "reconnect_timeout_s": 30},
    )
    collector = Collector(url, "outage")
    result: dict = {}
    run = threading.Thread(
        target=lambda: result.update(
            proc=framebatch(
                "run",
                str(config),
                "--until-done",
                "--summary-json",
                str(tmp_path / "s.json"),
                timeout=240,
            )
        )
    )
    try:
        run.start()
        if paced:
            wait_for(
                lambda: any(m.camera == "file" for m in collector.messages), 120, "file detections"
            )
            assert not file_ended_unread(url, "outage")  # 12 s of pacing: far from its end
        else:
            wait_for(lambda: file_ended_unread(url, "outage"), 120, "the file's unread end entry")
        server._process.send_signal(signal.SIGKILL)  # the guard: redis-server follows it
        server._process.wait()
        time.sleep(1.0)
        server = EmbeddedRedis(port=port, aof_dir=aof_dir).start()
        run.join(240)
    finally:
        messages = collector.stop()
        server.stop()
    proc = result["proc"]
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    cameras = {c["camera"]: c for c in summary["cameras"]}
    for camera in cameras.values():  # the totals add up whatever happened
        dropped = sum(camera["dropped"].values())
        assert camera["decoded"] == camera["processed"] + dropped + camera["in_flight"], camera
        assert camera["in_flight"] == 0
    file = cameras["file"]
    assert file["decoded"] == 60 and file["end_reason"] == "eof"
    unique = {m.frame_id: m for m in messages if m.camera == "file"}
    if persistent:
        # nothing lost: each of the 60 frames has exactly one detection after de-duplication
        assert file["dropped"] == {} and file["processed"] == 60
        assert sorted(m.seq for m in unique.values()) == list(range(60))
    else:
        # Redis lost what it held: counted, never invented, and the run went on
        assert set(file["dropped"]) <= {"redis_lost"}
        assert file["processed"] + file["dropped"].get("redis_lost", 0) == 60
        assert len(unique) <= file["processed"]
    assert set(cameras["live"]["dropped"]) <= {"redis_down", "redis_lost", "overflow", "stale"}
    if persistent:  # Redis kept everything: its ledger and detections account for every frame
        with connect(url) as client:
            server = EmbeddedRedis(port=port, aof_dir=aof_dir).start()
            try:
                reports = audit(client, StreamKeys("outage"), ["file", "live"])
            finally:
                server.stop()
        assert all(r.ok for r in reports), [r.line() for r in reports]
        assert reports[0].frames == reports[0].detected == 60


def test_redis_gone_for_good_ends_the_run_with_exit_3_and_one_line(assets, tmp_path):
    """Past redis.reconnect_timeout_s the run fails (exit 3), naming Redis and the setting;
    what the detections sinks wrote before, the JSON Lines file too, stays."""
    server = EmbeddedRedis(port=free_tcp_port()).start()
    lines = tmp_path / "detections.jsonl"
    config = write_config(
        tmp_path / "gone.yaml",
        model=MODEL,
        cameras=[{"id": "file", "url": str(CLIP), "realtime": True, "fps": 10}],
        redis_url=server.url,
        redis={"url": server.url, "prefix": "gone", "reconnect_timeout_s": 2},
        sinks=[{"kind": "redis_streams"}, {"kind": "jsonl", "path": str(lines)}],
    )
    result: dict = {}
    run = threading.Thread(
        target=lambda: result.update(proc=framebatch("run", str(config), timeout=120))
    )
    try:
        run.start()
        wait_for(lambda: lines.exists() and len(lines.read_text().splitlines()) >= 3, 90, "lines")
        with connect(server.url) as client:
            in_redis = client.xlen(StreamKeys("gone").detections("file"))
        server.stop()
        gone_at = time.monotonic()
        run.join(120)
    finally:
        server.stop()
    proc = result["proc"]
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - gone_at < 60  # a few reconnect timeouts, not a hang
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("framebatch: Redis at redis://127.0.0.1:"), last
    assert "unreachable for more than 2 s (redis.reconnect_timeout_s)" in last
    written = [json.loads(line)["frame_id"] for line in lines.read_text().splitlines()]
    assert len(written) >= in_redis and len(set(written)) == len(written)
