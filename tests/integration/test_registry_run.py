"""``framebatch run`` on a shared Redis follows the camera registry: a camera added through its
API is registered, changes another process writes to the registry (an add, a priority, a
removal) are carried out within a few ticks, and the cameras added survive a restart."""

from __future__ import annotations

import httpx
import pytest
import redis

from pipeline.config import CameraConfig
from pipeline.fleet.registry import CameraRegistry
from streams.keys import StreamKeys
from tests.conftest import MODEL, VIDEOS
from tests.integration.runner import free_port, start_daemon, stop_daemon, wait_for, write_config

pytestmark = pytest.mark.integration

HIGHWAY = VIDEOS / "highway_traffic_960x540_30fps.mp4"
STREET = VIDEOS / "street_night_1920x1080_3fps.mp4"
LOOPING = {"loop": True, "realtime": True, "fps": 5}


def view(client: httpx.Client, camera_id: str) -> dict | None:
    response = client.get(f"/api/cameras/{camera_id}")
    return response.json() if response.status_code == 200 else None


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False  # not listening yet


def processing(client: httpx.Client, camera_id: str, more_than: int = 0) -> bool:
    camera = view(client, camera_id)
    return camera is not None and camera["processed"] > more_than


def test_run_follows_the_registry_and_its_api_added_cameras_survive_a_restart(
    assets, tmp_path, redis_url, prefix
):
    port = free_port()
    config = write_config(
        tmp_path / "fleet.yaml",
        model=MODEL,
        cameras=[{"id": "cam1", "url": str(HIGHWAY), **LOOPING}],
        redis_url=redis_url,
        prefix=prefix,
        http={"listen": f"127.0.0.1:{port}"},
    )
    client_redis = redis.Redis.from_url(redis_url)
    registry = CameraRegistry(client_redis, StreamKeys(prefix))
    proc = start_daemon(config)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as client:
            wait_for(lambda: ready(client), 90, "ready", 0.3)
            assert set(registry.cameras()) == {"cam1"}  # seeded from the config

            added = client.post("/api/cameras", json={"id": "cam2", "url": str(STREET), **LOOPING})
            assert added.status_code == 201, added.text
            cam2 = registry.get("cam2")
            assert cam2 is not None and cam2.config.url == str(STREET)

            # what another process's API writes: carried out here
            registry.change(cam2.config.model_copy(update={"priority": 3}), cam2.version)
            wait_for(lambda: view(client, "cam2")["priority"] == 3, 10, "cam2's new priority")
            third = {"id": "cam3", "url": str(STREET), **LOOPING}
            registry.add(CameraConfig.model_validate(third))
            wait_for(lambda: processing(client, "cam3"), 60, "cam3 added through the registry")
            registry.remove("cam1")
            wait_for(lambda: view(client, "cam1")["state"] == "removed", 60, "cam1 to drain")
            wait_for(lambda: registry.get("cam1") is None, 5, "cam1 retired once drained")
            removing = client.delete("/api/cameras/cam3")
            assert removing.status_code == 202 and registry.get("cam3").removing
            again = client.post("/api/cameras", json=third)
            assert again.status_code == 409  # still draining here, and in the registry
            wait_for(lambda: registry.get("cam3") is None, 60, "cam3 drained and retired")
            assert client.post("/api/cameras", json=third).status_code == 201

            # this daemon's view of cam2 is current: its own change goes through
            assert client.patch("/api/cameras/cam2", json={"priority": 1}).status_code == 200
            assert registry.get("cam2").config.priority == 1
        code, _, err = stop_daemon(proc)
        assert code == 0, err[-3000:]

        # a restart: the config's cam1 seeded again, cam2 and cam3 from the registry
        proc = start_daemon(config)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as client:
            wait_for(lambda: ready(client), 90, "ready again", 0.3)
            for camera_id in ("cam1", "cam2", "cam3"):
                wait_for(lambda c=camera_id: processing(client, c), 60, f"{camera_id} again")
            assert view(client, "cam2")["priority"] == 1
        code, _, err = stop_daemon(proc)
        assert code == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        client_redis.close()
