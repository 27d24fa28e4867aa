"""``framebatch decode --summary-json``: each camera's end state and the frames its decoder
decoded, from the decoders' own events; ``--http``: its metrics and health (real
redis-server and PyAV, no model)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from streams.embedded_redis import free_tcp_port
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import framebatch, start_daemon, stop_daemon, wait_for, write_config

pytestmark = pytest.mark.integration


def test_the_decode_summary_says_how_each_camera_ended(redis_url, prefix, tmp_path):
    config = write_config(
        tmp_path / "decode.yaml",
        model=MODEL,  # never loaded by decode
        cameras=[
            {"id": "good", "url": str(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4")},
            {"id": "notvideo", "url": str(SAMPLE_CLIPS / "not_a_video.mp4")},
        ],
        redis_url=redis_url,
        prefix=prefix,
    )
    summary = tmp_path / "summary.json"
    proc = framebatch("decode", str(config), "--summary-json", str(summary), timeout=120)
    assert proc.returncode == 1, proc.stderr  # a camera failed
    cameras = {c["camera"]: c for c in json.loads(summary.read_text())["cameras"]}
    assert list(cameras) == ["good", "notvideo"]
    good, bad = cameras["good"], cameras["notvideo"]
    assert (good["state"], good["decoded"], good["end_reason"]) == ("ended", 60, "eof")
    assert good["sessions_ended"] == 1 and good["error"] == ""
    assert bad["state"] == "failed" and bad["decoded"] == 0 and bad["error"]


def test_decode_serves_metrics_and_health_on_http(redis_url, prefix, tmp_path):
    port = free_tcp_port()
    config = write_config(
        tmp_path / "decode.yaml",
        model=MODEL,
        # a looping file: the decoder runs (paced by its bounded stream) until stopped
        cameras=[
            {"id": "loop", "url": str(SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"), "loop": True}
        ],
        redis_url=redis_url,
        prefix=prefix,
    )
    decoder = start_daemon(config, "--http", f"127.0.0.1:{port}", command="decode")
    try:
        base = f"http://127.0.0.1:{port}"
        health = wait_for(lambda: _get(f"{base}/healthz"), 30, "decode's /healthz")
        assert json.loads(health) == {"status": "ok"}
        assert "framebatch_" in _get(f"{base}/metrics")
        assert _get(f"{base}/api/cameras") is None  # 404: no camera API where nothing detects
    finally:
        code, _out, err = stop_daemon(decoder)
    assert code == 0, err


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except OSError:  # not serving (yet)
        return None
