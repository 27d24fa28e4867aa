"""The HTTP endpoint of a real daemon: health, a camera added, re-prioritised and removed
without a restart (every frame counted), metrics reflecting it, and a taken port."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL, VIDEOS
from tests.integration.runner import (
    framebatch,
    free_port,
    start_daemon,
    stop_daemon,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

HIGHWAY = VIDEOS / "highway_traffic_960x540_30fps.mp4"
STREET = VIDEOS / "street_night_1920x1080_3fps.mp4"
LOOPING = {"loop": True, "realtime": True, "fps": 5}


def get(client: httpx.Client, path: str) -> httpx.Response | None:
    try:
        return client.get(path)
    except httpx.TransportError:
        return None  # not listening yet


@pytest.fixture
def daemon(assets, tmp_path):
    port = free_port()
    config = write_config(
        tmp_path / "api.yaml",
        model=MODEL,
        cameras=[{"id": "cam1", "url": str(HIGHWAY), **LOOPING}],
        redis_url=None,
        http={"listen": f"127.0.0.1:{port}"},
    )
    summary = tmp_path / "summary.json"
    proc = start_daemon(config, "--summary-json", str(summary))
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15)
    try:
        yield proc, client, summary
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def camera(client: httpx.Client, camera_id: str) -> dict:
    response = client.get(f"/api/cameras/{camera_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_cameras_are_added_changed_and_removed_live_and_every_frame_is_counted(daemon, tmp_path):
    proc, client, summary_path = daemon
    # alive while the model loads, ready once it is warm
    wait_for(
        lambda: (r := get(client, "/healthz")) is not None and r.status_code == 200, 60, "/healthz"
    )
    wait_for(lambda: get(client, "/readyz").status_code == 200, 90, "/readyz")

    added = client.post("/api/cameras", json={"id": "cam2", "url": str(STREET), **LOOPING})
    assert added.status_code == 201, added.text
    assert added.json()["state"] in ("starting", "running")
    wait_for(lambda: camera(client, "cam2")["processed"] > 0, 60, "cam2's first detections")
    assert {c["id"] for c in client.get("/api/cameras").json()} == {"cam1", "cam2"}

    # validated as a config entry: each problem names its field, no password shown
    bad = client.post(
        "/api/cameras", json={"id": "bad id", "url": "http://user:hunter2@host/x", "fps": -1}
    )
    assert bad.status_code == 422
    lines = bad.json()["detail"]
    assert [line.split(":")[0] for line in lines] == ["id", "url", "fps"], lines
    assert "hunter2" not in bad.text
    assert client.post("/api/cameras", json={"id": "cam2", "url": str(STREET)}).status_code == 409
    as_json = {"content-type": "application/json"}
    assert client.post("/api/cameras", content=b"[1, 2]", headers=as_json).status_code == 422
    # what a web page could send: a simple cross-site request, or one by a rebound name
    form = client.post("/api/cameras", content=b'{"id": "x", "url": "/x.mp4"}')
    assert form.status_code == 415
    rebound = client.get("/api/cameras", headers={"host": "evil.example:9108"})
    assert rebound.status_code == 403

    changed = client.patch("/api/cameras/cam2", json={"priority": 3})
    assert changed.status_code == 200 and changed.json()["priority"] == 3
    assert client.patch("/api/cameras/cam2", json={"priority": 42}).status_code == 422
    assert client.patch("/api/cameras/nope", json={"priority": 1}).status_code == 404

    removed = client.delete("/api/cameras/cam1")
    assert removed.status_code == 202 and removed.json()["state"] == "draining"
    wait_for(lambda: camera(client, "cam1")["state"] == "removed", 30, "cam1 to drain")
    cam1 = camera(client, "cam1")
    assert cam1["decoded"] == cam1["processed"] + sum(cam1["dropped"].values()) > 0
    assert client.delete("/api/cameras/cam1").status_code == 409
    assert client.get("/api/cameras/cam1/frame.jpg").status_code == 404  # let go with it
    # the id may come back: a new decoder session, counted on top of the first
    again = client.post("/api/cameras", json={"id": "cam1", "url": str(HIGHWAY), **LOOPING})
    assert again.status_code == 201, again.text
    wait_for(lambda: camera(client, "cam1")["processed"] > cam1["processed"], 60, "cam1 again", 0.3)
    frame = client.get("/api/cameras/cam2/frame.jpg")
    assert frame.status_code == 200 and frame.headers["content-type"] == "image/jpeg"
    assert frame.content[:2] == b"\xff\xd8"

    metrics = client.get("/metrics").text
    assert 'framebatch_camera_state{camera="cam1",state="running"} 1.0' in metrics
    assert 'framebatch_camera_up{camera="cam2"} 1.0' in metrics

    code, _, err = stop_daemon(proc)
    assert code == 0, err[-3000:]
    summary = json.loads(summary_path.read_text())
    cameras = {c["camera"]: c for c in summary["cameras"]}
    assert set(cameras) == {"cam1", "cam2"}
    for entry in cameras.values():  # nothing in flight: processed or dropped with a cause
        assert entry["decoded"] == entry["processed"] + sum(entry["dropped"].values()), entry
    assert cameras["cam1"]["processed"] > cam1["processed"]  # both of its lives


def test_a_taken_port_is_a_clear_start_up_error(assets, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "taken.yaml",
            model=MODEL,
            cameras=[{"id": "cam1", "url": str(STREET)}],
            redis_url=None,
        )
        started = time.monotonic()
        result = framebatch("run", str(config), "--http", f"127.0.0.1:{port}", timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"http.listen 127.0.0.1:{port}: cannot listen there" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 30  # before the model or any decoder starts


def test_the_default_port_taken_by_another_daemon_costs_only_the_endpoint(assets, tmp_path):
    """Several daemons on one host (past 256 cameras) must still start: the default port is
    the first one's; a port the config names is not given up (the test above)."""
    config = write_config(
        tmp_path / "second.yaml",
        model=MODEL,
        cameras=[{"id": "cam1", "url": str(STREET)}],
        redis_url=None,
        http={},  # the default, 127.0.0.1:9108
    )
    with socket.socket() as first:
        try:
            first.bind(("127.0.0.1", 9108))
            first.listen(1)
        except OSError:
            pass  # taken already: by whatever it is, the same case
        result = framebatch("run", str(config), "--until-done", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "http: 127.0.0.1:9108 is taken (another framebatch?)" in result.stderr
    assert "processed 8" in result.stdout


def test_more_cameras_added_than_the_batching_queue_held_are_all_read(assets, tmp_path):
    """The queue was sized from the config's cameras (four frames here); a reader reads at
    least one frame of each stream at a time, so more streams than that stalled every camera."""
    port = free_port()
    config = write_config(
        tmp_path / "grow.yaml",
        model=MODEL,
        cameras=[{"id": "base", "url": str(HIGHWAY), **LOOPING}],
        redis_url=None,
        max_batch_size=1,
        http={"listen": f"127.0.0.1:{port}"},
    )
    summary_path = tmp_path / "grow.json"
    proc = start_daemon(config, "--summary-json", str(summary_path))
    added = [f"clip{n}" for n in range(5)]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as client:
            wait_for(
                lambda: (r := get(client, "/readyz")) and r.status_code == 200, 90, "ready", 0.3
            )
            for camera_id in added:
                body = {"id": camera_id, "url": str(STREET)}
                assert client.post("/api/cameras", json=body).status_code == 201
            wait_for(
                lambda: all(camera(client, c)["processed"] == 8 for c in added),
                120,
                "every added clip's 8 frames",
                0.5,
            )
            before = camera(client, "base")["processed"]
            wait_for(lambda: camera(client, "base")["processed"] > before, 30, "base", 0.3)
    finally:
        code, _, err = stop_daemon(proc)
    assert code == 0, err[-3000:]
    cameras = {c["camera"]: c for c in json.loads(summary_path.read_text())["cameras"]}
    assert set(cameras) == {"base", *added}


# --- request bodies are capped before they are read (issue #21, item 13) ---------------------
MiB = 1024 * 1024
PIECE = b"x" * (64 * 1024)
RSS_GROWTH_MAX = 24 * MiB  # the cap is 64 KiB; a batch's tensors alone are larger than this


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


class RssPeak:
    """The highest VmRSS of a process while the block runs, sampled every 5 ms."""

    def __init__(self, pid: int):
        self.pid = pid
        self.before = self.peak = rss_bytes(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # what the server does after answering counts too
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))

    @property
    def growth(self) -> int:
        return self.peak - self.before


@dataclass
class Upload:
    status: int | None  # the server's answer; None if it closed without one
    sent: int  # body bytes written before the answer came (or the connection broke)
    seconds: float
    body: bytes = b""


def upload(port: int, path: str, size: int, *, chunked: bool, method: str = "POST") -> Upload:
    """Send ``size`` bytes of body in 64 KiB pieces over a raw socket, as fast as the server
    takes them, and stop as soon as it answers (or closes): what a client that means harm, or
    a buggy one, does. With ``chunked`` the body has no ``Content-Length``."""
    framing = b"Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}".encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        + framing
        + b"\r\n\r\n"
    )
    piece = f"{len(PIECE):x}\r\n".encode() + PIECE + b"\r\n" if chunked else PIECE
    started = time.monotonic()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        try:
            while sent < size:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break  # answered (or closed) before the whole body went
                sock.sendall(piece)
                sent += len(PIECE)
            else:
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed while the client was sending: its answer may be in
        seconds = time.monotonic() - started
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
            sock.settimeout(1)
            while data := sock.recv(65536):
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    if not answer.startswith(b"HTTP/1.1 "):
        return Upload(None, sent, seconds)
    status = int(answer.split(b" ", 2)[1])
    return Upload(status, sent, seconds, answer.partition(b"\r\n\r\n")[2])


@pytest.fixture
def idle_daemon(assets, tmp_path):
    """A daemon whose one camera (8 frames) is done: its memory holds still."""
    port = free_port()
    config = write_config(
        tmp_path / "idle.yaml",
        model=MODEL,
        cameras=[{"id": "cam1", "url": str(STREET)}],
        redis_url=None,
        http={"listen": f"127.0.0.1:{port}"},
    )
    proc = start_daemon(config)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as client:
            wait_for(lambda: (r := get(client, "/readyz")) and r.status_code == 200, 90, "ready")
            wait_for(lambda: camera(client, "cam1")["processed"] == 8, 60, "cam1's 8 frames")
            time.sleep(1.0)  # the last batch's buffers freed
            yield proc, port, client
    finally:
        code, _, err = stop_daemon(proc)
    assert code == 0, err[-3000:]


@pytest.mark.parametrize(
    ("path", "size", "chunked"),
    [
        ("/api/cameras", 400 * MiB, False),
        ("/api/cameras", 100 * MiB, True),
        ("/api/cameras/cam1", 100 * MiB, True),  # PATCH's body, read by FastAPI for its model
    ],
    ids=["content-length-400MiB", "chunked-100MiB", "chunked-patch"],
)
def test_a_huge_body_is_refused_before_it_is_read(idle_daemon, path, size, chunked):
    """An authorised client that sends hundreds of MiB gets 413 at once: a declared length
    over 64 KiB before any of the body is read, a chunked body once it passes 64 KiB, and the
    daemon's memory does not grow with what was sent (its peak grew by 800 MB for 400 MiB when
    the cap was checked after reading the whole body; under 1 MB since)."""
    proc, port, client = idle_daemon
    method = "PATCH" if path != "/api/cameras" else "POST"
    with RssPeak(proc.pid) as rss:
        answer = upload(port, path, size, chunked=chunked, method=method)
    print(
        f"{path} {size // MiB} MiB chunked={chunked}: {answer.status} after "
        f"{answer.sent / MiB:.1f} MiB in {answer.seconds:.2f} s; RSS {rss.before / MiB:.0f} MB, "
        f"peak +{rss.growth / MiB:.1f} MB"
    )
    assert answer.status == 413, answer
    assert b"64 KiB" in answer.body
    assert answer.sent < 32 * MiB, answer  # not the whole body (its time is printed only)
    assert rss.growth < RSS_GROWTH_MAX, (rss.before, rss.peak)
    # the daemon serves on, and a camera's body under the cap still goes through
    assert client.get("/healthz").status_code == 200
    assert client.patch("/api/cameras/cam1", json={"priority": 2}).status_code == 200
