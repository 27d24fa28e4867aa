"""Split roles following the camera registry on a real redis-server: a camera added through a
``framebatch detect`` worker's API while ``framebatch decode`` runs is decoded and detected, a
change of another writer refused; removed, its decoder stops, the worker holding it reads it to
its end and retires it, every one of its frames detected or dropped with a cause."""

from __future__ import annotations

import httpx
import pytest
import redis

from framebatch_tools.audit import audit_camera
from pipeline.fleet.registry import CameraRegistry, RegistryConflict
from streams.embedded_redis import EmbeddedRedis
from streams.keys import StreamKeys
from tests.conftest import MODEL, SAMPLE_CLIPS
from tests.integration.runner import (
    free_port,
    start_daemon,
    stop_daemon,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

CLIP = SAMPLE_CLIPS / "testsrc_640x360_15fps.mp4"
PREFIX = "registry"
LOOPING = {"url": str(CLIP), "loop": True, "realtime": True, "fps": 5}


def test_split_roles_follow_a_camera_registered_and_removed(assets, tmp_path):
    keys = StreamKeys(PREFIX)
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = write_config(
            tmp_path / "split.yaml",
            model=MODEL,
            cameras=[{"id": "base", **LOOPING}],
            redis_url=server.url,
            prefix=PREFIX,
            redis={"url": server.url, "prefix": PREFIX, "lease_ttl_s": 2.0},
            max_batch_size=4,
        )
        registry = CameraRegistry(client, keys)
        port = free_port()
        worker = start_daemon(
            config, "--http", f"127.0.0.1:{port}", "--worker-id", "w1", command="detect"
        )
        decoders = start_daemon(config, "--http", "off", command="decode")
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15)
        try:
            wait_for(lambda: client.xlen(keys.detections("base")) > 0, 90, "base detected")
            assert set(registry.cameras()) == {"base"}  # seeded by both, the same

            added = api.post("/api/cameras", json={"id": "late", **LOOPING})
            assert added.status_code == 201, added.text
            assert api.post("/api/cameras", json={"id": "late", **LOOPING}).status_code == 409
            bad = api.post("/api/cameras", json={"id": "bad", "url": str(CLIP), "fps": -1})
            assert bad.status_code == 422 and "fps" in bad.text
            wait_for(lambda: client.xlen(keys.detections("late")) >= 5, 60, "late detected")
            assert client.get(keys.lease("late")) == b"w1"
            late = registry.get("late")
            assert api.patch("/api/cameras/late", json={"priority": 2}).status_code == 200
            # another writer that read the camera before that change loses, and is told
            stale = late.config.model_copy(update={"priority": 5})
            with pytest.raises(RegistryConflict, match="changed since version"):
                registry.change(stale, late.version)
            assert registry.get("late").config.priority == 2

            assert api.delete("/api/cameras/late").status_code == 202
            wait_for(lambda: registry.get("late") is None, 60, "late drained and retired")
            report = audit_camera(client, keys, "late")
            assert report.ok and report.sessions == 1 and report.frames >= 5, report.line()
            assert client.get(keys.lease("late")) is None  # let go with it
            wait_for(lambda: api.get("/api/cameras/late").json()["state"] == "removed", 5, "shown")
            assert client.xlen(keys.detections("base")) > 0
        finally:
            api.close()
            results = [stop_daemon(p) for p in (decoders, worker)]
        for code, _out, err in results:
            assert code == 0, err[-3000:]
        assert "camera late: decoded here from now" in results[0][2]
        assert "camera late: drained and retired from the registry" in results[1][2]
