"""Live RTSP ingest, graceful SIGTERM, and bad inputs that must affect only themselves."""

from __future__ import annotations

import importlib.util
import time

import pytest

from framebatch_tools.audit import audit
from pipeline.config import load_config
from pipeline.supervisor.builders import decode_threads
from streams.consumer import DetectionConsumer
from streams.embedded_redis import free_tcp_port
from streams.keys import StreamKeys
from streams.rtsp_replay import rtsp_server_available, serve_rtsp
from tests.conftest import MODEL, SAMPLE_CLIPS, VIDEOS
from tests.integration.runner import (
    framebatch,
    published,
    run_until_done,
    start_daemon,
    stop_daemon,
    write_config,
)

pytestmark = pytest.mark.integration

STREET = VIDEOS / "street_night_1920x1080_3fps.mp4"  # 8 frames: the healthy camera beside bad ones


@pytest.fixture(scope="module")
def rtsp_url(assets):
    available, why = rtsp_server_available()
    if not available:
        pytest.skip(why)
    with serve_rtsp(VIDEOS / "highway_traffic_960x540_30fps.mp4", max_frames=120) as url:
        yield url


def test_rtsp_camera_is_ingested_and_detected_then_sigterm_exits_cleanly(
    rtsp_url, redis_url, redis_client, prefix, tmp_path
):
    config = write_config(
        tmp_path / "live.yaml",
        model=MODEL,
        cameras=[{"id": "bridge", "url": rtsp_url}],
        redis_url=redis_url,
        prefix=prefix,
    )
    daemon = start_daemon(config)
    try:
        consumer = DetectionConsumer(redis_client, StreamKeys(prefix), from_start=True)
        messages = list(consumer.messages(count=30, timeout_s=60))
    finally:
        code, out, err = stop_daemon(daemon)
    assert len(messages) == 30, err
    assert {m.camera for m in messages} == {"bridge"}
    assert (messages[0].width, messages[0].height) == (960, 540)
    assert sum(len(m.detections) for m in messages) > 0  # the highway has cars
    seqs = [m.seq for m in messages]
    assert seqs == sorted(seqs)  # per-camera order holds
    assert code == 0, err
    assert "framebatch summary" in out and "Traceback" not in err
    # graceful stop: every frame read was published and acknowledged, nothing left pending
    pending = redis_client.xpending(StreamKeys(prefix).frames("bridge"), "framebatch-batcher")
    assert pending["pending"] == 0


def test_bad_cameras_fail_alone_with_clear_messages(
    assets, redis_url, redis_client, prefix, tmp_path
):
    dead_port = free_tcp_port()  # nothing listens there
    config = write_config(
        tmp_path / "faults.yaml",
        model=MODEL,
        cameras=[
            {"id": "good", "url": str(STREET)},
            {"id": "missing", "url": str(tmp_path / "no_such_clip.mp4")},
            {"id": "notvideo", "url": str(SAMPLE_CLIPS / "not_a_video.mp4")},
            {"id": "corrupt", "url": str(SAMPLE_CLIPS / "corrupt_truncated.mp4")},
            {"id": "deadcam", "url": f"rtsp://admin:s3cret-pw@127.0.0.1:{dead_port}/stream"},
        ],
        redis_url=redis_url,
        prefix=prefix,
    )
    result = run_until_done(config, timeout=180)
    assert result.returncode == 1  # finished, but some cameras failed
    assert "Traceback" not in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout
    for camera in ("missing", "notvideo", "deadcam"):
        assert f"camera '{camera}'" in result.stderr
    assert "admin:***@127.0.0.1" in result.stderr
    cameras = {c["camera"]: c for c in result.summary["cameras"]}
    # the healthy camera is untouched: all 8 frames published, in order
    assert [m.seq for m in published(redis_client, prefix, "good")] == list(range(8))
    assert cameras["good"]["dropped"] == {} and cameras["good"]["end_reason"] == "eof"
    assert (
        cameras["missing"]["end_reason"] == "error" and cameras["notvideo"]["end_reason"] == "error"
    )
    # the corrupt file keeps what decodes and counts what did not (15 packets): decoding on one
    # thread (five cameras, at least as many as cores) recovers 12 frames; FFmpeg's frame
    # threading, where a lost frame raises nothing, 10
    corrupt = cameras["corrupt"]
    kept = 12 if decode_threads(load_config(config)) == 1 else 10
    assert corrupt["dropped"] == {"decode_error": 15 - kept}
    assert corrupt["processed"] + corrupt["dropped"]["decode_error"] == corrupt["decoded"] == 15
    assert len(published(redis_client, prefix, "corrupt")) == corrupt["processed"] == kept
    # a live camera that never connected did not reach its end
    assert cameras["deadcam"]["error"] and cameras["deadcam"]["processed"] == 0
    # and Redis holds the same account: detections or ledger entries for every frame
    reports = {r.camera: r for r in audit(redis_client, StreamKeys(prefix), list(cameras))}
    assert all(r.ok for r in reports.values()), [r.line() for r in reports.values()]
    assert reports["corrupt"].frames == 15 and reports["corrupt"].detected == kept
    assert reports["corrupt"].dropped == {"decode_error": 15 - kept}
    assert reports["good"].frames == reports["good"].detected == 8


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("model: {path: m.onnx}\ncameras: []\n", "cameras"),
        (
            "model: {path: m.onnx}\nbatching: {max_wiat_ms: 5}\ncameras: [{id: a, url: a.mp4}]\n",
            "did you mean 'max_wait_ms'",
        ),
        (
            "model: {path: m.onnx}\ncameras: [{id: a, url: 'htp://u:pw1234@h/x'}]\n",
            "cameras[0].url",
        ),
    ],
)
def test_invalid_config_exits_2_with_the_dotted_path(tmp_path, yaml_text, expected):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    for command in (["check-config", str(config)], ["run", str(config), "--until-done"]):
        proc = framebatch(*command, timeout=60)
        assert proc.returncode == 2
        assert expected in proc.stderr
        assert "Traceback" not in proc.stderr and "pw1234" not in proc.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    config = write_config(
        tmp_path / "c.yaml",
        model=tmp_path / "nope.onnx",
        cameras=[{"id": "a", "url": str(STREET)}],
        redis_url=None,
    )
    proc = framebatch("run", str(config), "--until-done", timeout=60)
    assert proc.returncode == 2
    assert "nope.onnx" in proc.stderr and "Traceback" not in proc.stderr


def test_a_backend_without_its_library_is_a_clear_error(tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is installed here")
    engine = tmp_path / "yolov8n.engine"
    engine.write_bytes(b"not an engine")
    config = write_config(
        tmp_path / "c.yaml", model=engine, cameras=[{"id": "a", "url": str(STREET)}], redis_url=None
    )
    proc = framebatch("run", str(config), "--until-done", timeout=60)
    assert proc.returncode == 2
    assert "pip install tensorrt" in proc.stderr and "Traceback" not in proc.stderr


def test_consume_cli_prints_json_lines_and_group_acknowledges(
    assets, redis_url, redis_client, prefix, tmp_path
):
    import json

    config = write_config(
        tmp_path / "c.yaml",
        model=MODEL,
        cameras=[{"id": "street", "url": str(STREET)}],
        redis_url=redis_url,
        prefix=prefix,
    )
    assert run_until_done(config).returncode == 0
    base = ["consume", "--redis", redis_url, "--prefix", prefix]
    proc = framebatch(*base, "--from-start", "--count", "5", timeout=60)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["seq"] for line in lines] == [0, 1, 2, 3, 4]
    assert lines[0]["camera"] == "street" and lines[0]["width"] == 1920
    # only new messages by default: nothing new arrives, so --timeout ends it with no output
    started = time.monotonic()
    proc = framebatch(*base, "--timeout", "1", timeout=60)
    assert proc.returncode == 0 and proc.stdout == "" and time.monotonic() - started < 30
    # a durable group prints everything once and acknowledges it
    proc = framebatch(
        *base, "--from-start", "--group", "audit", "--camera", "street", "--timeout", "1"
    )
    assert len(proc.stdout.splitlines()) == 8
    assert redis_client.xpending(StreamKeys(prefix).detections("street"), "audit")["pending"] == 0
    proc = framebatch(*base, "--group", "audit", "--timeout", "1")
    assert proc.stdout == ""
