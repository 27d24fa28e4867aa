"""``framebatch models fetch``: a known model from the shared assets, or downloaded from a real
HTTP server on 127.0.0.1 (standing in for the upstream release or a site's mirror), checked
by sha256 and exported; a wrong file, a dead server or no way at all is said clearly (what, where
it looked, what to do) and leaves nothing in the cache."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from detectors.backends import load_backend
from detectors.catalog import KNOWN_MODELS, model_path
from detectors.detector import Detector
from detectors.downloads import FetchError, NotFetched, Unreachable, download_verified, sha256_of
from detectors.fetch import fetch_model
from detectors.postprocess import Thresholds
from pipeline.config import parse_config
from streams.embedded_redis import free_tcp_port
from tests.conftest import ASSETS, MODEL_ANY_SIZE, VIDEOS
from tests.integration.runner import framebatch

pytestmark = pytest.mark.integration

YOLOV8N = KNOWN_MODELS["yolov8n"]
SHARED_CHECKPOINT = ASSETS / "models" / "yolov8n-coco.pt"


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[str, Path]]:
    """(base URL, folder) of a real HTTP server on 127.0.0.1 serving the folder."""
    root = tmp_path / "mirror"
    folder = root / "weights"
    folder.mkdir(parents=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/weights", folder
    server.shutdown()
    server.server_close()


def test_links_the_shared_onnx_and_a_config_names_it(assets, tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEBATCH_CACHE", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "models"
    path = fetch_model(YOLOV8N, cache=cache, assets_dir=assets, allow_download=False)
    assert path == model_path("yolov8n") == cache / "yolov8n.onnx"
    assert path.is_symlink() and path.resolve() == MODEL_ANY_SIZE.resolve()
    config = parse_config(
        {"model": {"path": "yolov8n"}, "cameras": [{"id": "a", "url": "a.mp4"}]}, base_dir="/x"
    )
    assert config.model.path == path  # the bare name is the cache entry, not /x/yolov8n
    # fetched again: kept, not linked twice
    assert fetch_model(YOLOV8N, cache=cache, assets_dir=None, allow_download=False) == path


def test_a_config_naming_a_model_not_fetched_says_how_to_fetch_it(assets, tmp_path):
    config = tmp_path / "c.yaml"
    clip = VIDEOS / "street_night_1920x1080_3fps.mp4"
    config.write_text(f"model: {{path: yolov8n}}\ncameras: [{{id: a, url: {clip}}}]\n")
    env = {**os.environ, "FRAMEBATCH_CACHE": str(tmp_path / "empty")}
    proc = framebatch("run", str(config), "--until-done", env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "model yolov8n is not fetched yet: run `framebatch models fetch yolov8n`" in proc.stderr


def test_a_download_with_the_wrong_sha256_is_not_kept(assets, served, tmp_path):
    base, folder = served
    # a real checkpoint, but not the pinned official file: the sha256 must refuse it
    (folder / YOLOV8N.checkpoint_name).write_bytes(SHARED_CHECKPOINT.read_bytes())
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match=f"has sha256 {sha256_of(SHARED_CHECKPOINT)}, expected"):
        fetch_model(YOLOV8N, cache=cache, assets_dir=None, allow_download=True, mirror=base)
    assert list(cache.iterdir()) == []  # no partial file, no checkpoint, no model


def test_a_missing_file_a_dead_server_and_no_way_at_all_are_said_clearly(served, tmp_path):
    base, _ = served  # serves nothing
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match=f"from {base}/yolov8n.pt failed: HTTP 404 File not found"):
        fetch_model(YOLOV8N, cache=cache, assets_dir=None, allow_download=True, mirror=base)
    port = free_tcp_port()  # nothing listens there
    dead = f"http://127.0.0.1:{port}/weights"
    with pytest.raises(Unreachable, match=f"^127.0.0.1:{port} unreachable"):
        download_verified(f"{dead}/yolov8n.pt", cache / "x", "0" * 64, what="x")
    with pytest.raises(NotFetched, match=f"download failed: 127.0.0.1:{port} unreachable"):
        fetch_model(YOLOV8N, cache=cache, assets_dir=None, allow_download=True, mirror=dead)
    assert list(cache.iterdir()) == []
    env = {**os.environ, "FRAMEBATCH_CACHE": str(tmp_path / "cache2")}
    proc = framebatch(
        "models", "fetch", "yolov8n", "--no-download", "--assets", "/", env=env, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"framebatch models fetch: yolov8n is not in the cache {tmp_path / 'cache2' / 'models'}",
        f"  looked in: /{YOLOV8N.shared_onnx} (from --assets)",
        "  not downloaded: downloads are off (--no-download)",
        "  point elsewhere: --assets PATH, FRAMEBATCH_ASSETS=PATH, or model.path: FILE.onnx in "
        "the config",
        "  fetch when online: framebatch models fetch yolov8n",
    ]


def test_no_export_stops_at_the_verified_checkpoint_which_no_download_then_uses(
    assets, served, tmp_path
):
    """``make demo``'s order: download first (offline is known before any extra is
    installed), export later from the cache, without downloading again."""
    base, folder = served
    (folder / "yolov8n.pt").write_bytes(SHARED_CHECKPOINT.read_bytes())
    model = replace(YOLOV8N, checkpoint_sha256=sha256_of(SHARED_CHECKPOINT))
    cache = tmp_path / "cache"
    path = fetch_model(
        model, cache=cache, assets_dir=None, allow_download=True, mirror=base, export=False
    )
    assert path == cache / "yolov8n.pt" and sorted(p.name for p in cache.iterdir()) == [path.name]
    said: list[str] = []
    again = fetch_model(
        model, cache=cache, assets_dir=None, allow_download=False, export=False, say=said.append
    )
    assert again == path and said == [f"present    {path} (sha256 ok)"]


def test_a_verified_download_is_exported_to_a_model_that_detects(assets, served, tmp_path):
    """The whole download path, with a catalog entry pinned to the shared checkpoint's sha256
    (the official file is not in the test data): served, verified, exported with dynamic
    height and width, and finding what the shared ONNX of the same weights finds."""
    pytest.importorskip("ultralytics", reason="exporting a .pt needs the Ultralytics extra")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(tmp_path / "yolo-config"))
    base, folder = served
    (folder / "yolov8n.pt").write_bytes(SHARED_CHECKPOINT.read_bytes())
    model = replace(
        YOLOV8N,
        checkpoint_sha256=sha256_of(SHARED_CHECKPOINT),
        checkpoint_bytes=SHARED_CHECKPOINT.stat().st_size,
    )
    cache = tmp_path / "cache"
    said: list[str] = []
    path = fetch_model(
        model, cache=cache, assets_dir=None, allow_download=True, mirror=base, say=said.append
    )
    assert said[0] == f"download   {base}/yolov8n.pt" and said[-1] == f"exported   {path}"
    assert sorted(p.name for p in cache.iterdir()) == ["yolov8n.onnx", "yolov8n.pt"]
    frame = decode_first(VIDEOS / "street_night_1920x1080_3fps.mp4")  # 24 people and more
    ours = Detector(load_backend(path, threads=2), thresholds=Thresholds())
    shared = Detector(load_backend(MODEL_ANY_SIZE, threads=2), thresholds=Thresholds())
    assert ours.info.any_size  # rectangular batches work with it
    (found,) = ours.detect_frames([frame], rect=True)
    (expected,) = shared.detect_frames([frame], rect=True)
    assert len(found.boxes) == len(expected.boxes) > 10
    np.testing.assert_allclose(found.boxes, expected.boxes, atol=1.0)
    assert list(found.class_ids) == list(expected.class_ids)
    # the verified checkpoint stays: a second fetch after the ONNX was lost does not download
    path.unlink()
    said.clear()
    fetch_model(model, cache=cache, assets_dir=None, allow_download=True, say=said.append)
    assert said[0].startswith("present") and "sha256 ok" in said[0]


def decode_first(path: Path) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        return next(container.decode(video=0)).to_ndarray(format="bgr24")
