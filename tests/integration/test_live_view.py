"""The live view in a real (headless) browser, and the bearer token, against a running daemon.

Chromium loads ``/`` with ``--dump-dom``: the page's own fetches, timers and image loads run
(on virtual time, which waits for pending requests), and the DOM they built comes back. The
browser has no network but this machine's loopback (every other name fails to resolve, every
other address goes to a proxy that is not there), as on a site without the internet.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar

import cv2
import httpx
import numpy as np
import pytest
import yaml

from pipeline.serve.live_view import LINE_COLOUR, ZONE_COLOUR
from tests.conftest import MODEL, VIDEOS
from tests.integration.runner import write_config

pytestmark = pytest.mark.integration

T = TypeVar("T")

TOKEN = "live-view-test-token-0123456789"
LOOPING = {"loop": True, "realtime": True, "fps": 5}  # replays until stopped
CLIPS = {
    "lobby": VIDEOS / "indoor_person_768x432_10fps.mp4",
    "street.night": VIDEOS / "street_night_1920x1080_3fps.mp4",
}
#: the lobby's person tracked in a zone over most of the frame, a snapshot as each track starts
LOBBY_ANALYTICS = {
    "coordinates": "normalized",
    "tracker": {},
    "zones": {"room": {"polygon": [[0.1, 0.1], [0.9, 0.1], [0.9, 0.9], [0.1, 0.9]]}},
    "snapshots": {"kinds": ["track_start", "zone_enter"]},
}
SERVING = re.compile(r"http: metrics, health, API and live view on (http://\S+)")
START_S = 60.0  # model load and warm-up on two slow cores included
STOP_S = 30.0
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BUDGET_MS = 3500  # virtual time: the page refreshes every second, so at least three updates
OFFLINE = (
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
    "--proxy-server=http://127.0.0.1:9",  # addresses given as numbers (loopback is never proxied)
)


def wait_for(check: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


@dataclass
class Daemon:
    """``framebatch run CONFIG`` in a subprocess; its log in files (no pipe to fill up)."""

    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    summary: Path  # --summary-json
    url: str = ""

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")

    def serving(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"framebatch exited with {self.proc.returncode}:\n{self.log()}")
        match = SERVING.search(self.log())
        return match.group(1) if match else None

    def stop(self) -> int:
        """SIGTERM, wait; kill only when it hangs (and say so)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"framebatch ignored SIGTERM for {STOP_S:.0f} s") from None


def failed_cameras(summary: dict[str, Any]) -> set[str]:
    """As ``CameraSummary.failed``: the source failed, the decoder died, or a live camera was
    stopped while it could not connect."""
    return {
        c["camera"]
        for c in summary["cameras"]
        if c["end_reason"] in ("error", "crashed") or c["error"]
    }


@contextmanager
def running_daemon(config: Path, headers: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon whose endpoint is up, whose model is warm and whose cameras all have a frame
    detected; stopped with SIGTERM at the end, which it must survive cleanly: exit code 0, or 1
    where only cameras added through the API failed (the CLI's exit code for failed cameras)."""
    stdout, stderr = config.with_suffix(".out"), config.with_suffix(".err")
    summary = config.with_suffix(".summary.json")
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "run", str(config)]
            + ["--summary-json", str(summary)],
            stdout=out,
            stderr=err,
        )
    daemon = Daemon(proc, stdout, stderr, summary)
    try:
        daemon.url = wait_for(daemon.serving, START_S, "the http line in the log")
        with httpx.Client(base_url=daemon.url, headers=headers, timeout=10) as client:
            wait_for(lambda: client.get("/readyz").status_code == 200, START_S, "/readyz")
            wait_for(
                lambda: all(c["processed"] > 0 for c in client.get("/api/cameras").json()),
                START_S,
                "a detected frame of every camera",
            )
        yield daemon
    finally:
        code = daemon.stop()
    log = daemon.log()
    assert "Traceback" not in log, log
    assert "framebatch summary" in daemon.stdout.read_text(), log
    failed = failed_cameras(json.loads(summary.read_text()))
    configured = {camera["id"] for camera in yaml.safe_load(config.read_text())["cameras"]}
    assert not failed & configured, (failed, log)
    assert code == (1 if failed else 0), (code, failed, log)


def looping_config(
    path: Path,
    redis_url: str,
    clips: dict[str, Path],
    analytics: dict[str, dict[str, Any]] | None = None,
    **http: Any,
) -> Path:
    """``analytics``: by camera, its ``analytics`` settings."""
    settings = analytics or {}
    return write_config(
        path,
        model=MODEL,
        cameras=[
            {"id": camera, "url": str(clip), **LOOPING}
            | ({"analytics": settings[camera]} if camera in settings else {})
            for camera, clip in clips.items()
        ],
        redis_url=redis_url,
        prefix=path.stem,  # the session's Redis is shared: keys of its own
        http={"listen": "127.0.0.1:0", **http},
    )


# --- the page as the browser built it -------------------------------------------------------
@dataclass
class Tile:
    processed: int
    frame: str | None  # the image's natural size once loaded ("640x360"), "error" if it failed
    source: str | None = None  # live, replay (a file replayed in real time) or file
    src: str | None = None
    #: the latest events shown under the frame: (kind, its snapshot's natural size or None)
    events: list[tuple[str, str | None]] = field(default_factory=list)


@dataclass
class Page:
    updates: int = 0  # refreshes the page completed
    updated: str = ""
    tiles: dict[str, Tile] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)  # an <a>'s id -> its href


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = Page()
        self._updated = False
        self._tile: Tile | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        element_id = attr.get("id") or ""
        if element_id == "updated":
            self.page.updates = int(attr.get("data-updates") or 0)
            self._updated = True
        elif element_id.startswith("camera-"):
            self._tile = Tile(
                int(attr.get("data-processed") or 0),
                attr.get("data-frame"),
                attr.get("data-source"),
            )
            self.page.tiles[element_id.removeprefix("camera-")] = self._tile
        elif tag == "img" and self._tile is not None and attr.get("class") == "frame":
            self._tile.src = attr.get("src")
        elif tag == "li" and self._tile is not None and attr.get("class") == "event":
            self._tile.events.append((attr.get("data-kind") or "", attr.get("data-snapshot")))
        elif tag == "a" and element_id:
            self.page.links[element_id] = attr.get("href") or ""

    def handle_data(self, data: str) -> None:
        if self._updated:
            self.page.updated += data

    def handle_endtag(self, tag: str) -> None:
        self._updated = False


def browser() -> str:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    pytest.skip(f"no headless browser: none of {', '.join(BROWSERS)} is installed")


def load_page(chrome: str, url: str, profile: Path) -> Page:
    """The live view's DOM after ``BUDGET_MS`` of the page's (virtual) time."""
    parser = _PageParser()
    parser.feed(dump_dom(chrome, url, profile))
    return parser.page


def dump_dom(chrome: str, url: str, profile: Path) -> str:
    """The DOM a page built after ``BUDGET_MS`` of its (virtual) time, offline."""
    result = subprocess.run(
        [
            chrome,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={BUDGET_MS}",
            *OFFLINE,
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "<html" in result.stdout, result.stderr[-2000:]
    return result.stdout


# --- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(assets, redis_url, tmp_path_factory) -> Iterator[Daemon]:
    config = looping_config(
        tmp_path_factory.mktemp("live") / "live.yaml",
        redis_url,
        CLIPS,
        analytics={"lobby": LOBBY_ANALYTICS},
        token=TOKEN,
    )
    with running_daemon(config, {"Authorization": f"Bearer {TOKEN}"}) as running:
        yield running


@pytest.fixture
def api(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=10) as client:
        yield client


def test_every_camera_has_a_tile_with_its_newest_frame_and_the_page_updates(
    daemon: Daemon, api: httpx.Client, tmp_path
):
    chrome = browser()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    listed = api.get("/api/cameras", headers=bearer).json()
    cameras = {c["id"] for c in listed}
    assert cameras == set(CLIPS)
    # files replayed at their frame rate, as the demo's: not live (network) cameras, and the
    # API and the view say so with the same words
    assert all(not c["live"] and c["realtime"] for c in listed), listed

    first = load_page(chrome, f"{daemon.url}/?token={TOKEN}", tmp_path / "profile")
    assert set(first.tiles) == cameras, first
    assert first.updates >= 2, first  # refreshed by its timer, not only once
    assert not first.updated.startswith("error"), first.updated
    for camera, tile in first.tiles.items():
        assert tile.processed > 0, (camera, tile)
        assert tile.source == "replay", (camera, tile)
        assert tile.src and tile.src.startswith(f"/api/cameras/{camera}/frame.jpg?"), tile
        # the browser loaded the image: its onload noted the natural size
        assert tile.frame and re.fullmatch(r"[1-9]\d*x[1-9]\d*", tile.frame), (camera, tile)
        frame = api.get(tile.src)  # the src carries the token for the <img>
        assert frame.status_code == 200
        assert frame.headers["content-type"] == "image/jpeg"
        assert frame.content.startswith(b"\xff\xd8")  # a JPEG's SOI marker
        assert api.get(tile.src.split("?")[0]).status_code == 401  # not without the token

    time.sleep(2.0)  # 5 frames a second each: ten more processed per camera
    second = load_page(chrome, f"{daemon.url}/?token={TOKEN}", tmp_path / "profile")
    assert set(second.tiles) == cameras
    for camera in cameras:
        assert second.tiles[camera].processed > first.tiles[camera].processed, (first, second)


def test_the_api_and_the_view_need_the_token_while_metrics_and_probes_stay_open(
    api: httpx.Client,
):
    for path in ("/api/cameras", "/api/stats", "/api/cameras/lobby", "/"):
        refused = api.get(path)
        assert refused.status_code == 401, (path, refused.text)
        assert refused.headers["www-authenticate"] == "Bearer"
        assert (
            api.get(path, headers={"Authorization": "Bearer not-the-token-0000"}).status_code == 401
        )
    cameras = api.get("/api/cameras", headers={"Authorization": f"Bearer {TOKEN}"})
    assert cameras.status_code == 200
    assert {c["id"] for c in cameras.json()} == set(CLIPS)
    assert api.get("/api/cameras", params={"token": TOKEN}).status_code == 200  # as the page
    # a change needs the token too, and one refused changes nothing
    assert api.patch("/api/cameras/lobby", json={"priority": 3}).status_code == 401
    assert api.delete("/api/cameras/lobby").status_code == 401
    lobby = api.get("/api/cameras/lobby", params={"token": TOKEN}).json()
    assert lobby["priority"] == 0 and lobby["state"] == "running"

    metrics = api.get("/metrics")
    assert metrics.status_code == 200
    assert 'framebatch_frames_processed_total{camera="lobby"}' in metrics.text
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready"}


def test_the_api_browser_works_offline_and_the_view_links_it(
    daemon: Daemon, api: httpx.Client, tmp_path
):
    """``/docs`` (Swagger UI) renders every operation of ``/openapi.json`` with no network:
    its scripts and styles come from the daemon, not a CDN; the live view links both."""
    chrome = browser()
    schema = api.get("/openapi.json")
    assert schema.status_code == 200
    paths = set(schema.json()["paths"])
    assert "/api/cameras" in paths
    dom = dump_dom(chrome, f"{daemon.url}/docs", tmp_path / "profile")
    rendered = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))
    assert rendered == paths, (rendered, dom[-2000:])
    for asset in re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', dom):
        assert api.get(asset).status_code == 200, asset
    redoc = api.get("/redoc").text  # ReDoc's script is the daemon's too
    assert re.findall(r'src="([^"]+)"', redoc) == ["/docs-assets/redoc.standalone.js"], redoc

    page = load_page(chrome, f"{daemon.url}/?token={TOKEN}", tmp_path / "profile")
    assert page.links["api-docs"] == "/docs" and page.links["api-schema"] == "/openapi.json"


def coloured(jpeg: bytes, bgr: tuple[int, int, int]) -> int:
    """Pixels of a JPEG near a colour (the overlay's: rare in a real scene)."""
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    return int((np.abs(image.astype(int) - bgr).max(axis=2) < 40).sum())


def test_the_view_draws_zones_and_lines_and_lists_events_with_snapshots_and_edits_go_live(
    daemon: Daemon, api: httpx.Client, tmp_path
):
    """The lobby's zone is drawn on its frame and its latest events show with their
    snapshots; its analytics changed through the API (a line instead of the zone) is on the
    next frames drawn; a bad change names the field and changes nothing."""
    chrome = browser()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    frame_of = lambda: api.get("/api/cameras/lobby/frame.jpg", headers=bearer).content  # noqa: E731
    processed = lambda: api.get("/api/cameras/lobby", headers=bearer).json()["processed"]  # noqa: E731

    wait_for(
        lambda: api.get("/api/events", params={"camera": "lobby"}, headers=bearer).json(),
        START_S,
        "the lobby's first events",
    )
    page = load_page(chrome, f"{daemon.url}/?token={TOKEN}", tmp_path / "profile")
    lobby = page.tiles["lobby"]
    assert lobby.events, lobby
    assert {kind for kind, _ in lobby.events} <= {"track_start", "zone_enter", "track_end"}
    # each snapshot the page shows was loaded by the browser: it noted the natural size
    assert all(re.fullmatch(r"[1-9]\d*x[1-9]\d*", size) for _, size in lobby.events if size)
    assert any(size for _, size in lobby.events), lobby.events
    assert not page.tiles["street.night"].events  # no analytics there

    assert coloured(frame_of(), ZONE_COLOUR) > 300  # the zone's outline
    assert coloured(frame_of(), LINE_COLOUR) < 50
    read = api.get("/api/cameras/lobby/analytics", headers=bearer).json()
    assert read["settings"]["zones"]["room"]["polygon"][0] == [0.1, 0.1]
    assert set(read["zones"]) == {"room"}

    line = {
        "coordinates": "normalized",
        "tracker": {},
        "lines": {"door": {"start": [0.2, 0.5], "end": [0.8, 0.5]}},
    }
    assert api.put("/api/cameras/lobby/analytics", json=line).status_code == 401
    twisted = {**line, "zones": {"bow": {"polygon": [[0, 0], [1, 1], [1, 0], [0, 1]]}}}
    refused = api.put("/api/cameras/lobby/analytics", json=twisted, headers=bearer)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0].startswith("analytics.zones.bow.polygon:"), refused.text
    # pixels beyond the lobby's 768x432 frames: refused now, not found at its next frame
    beyond = {"tracker": {}, "zones": {"far": {"polygon": [[0, 0], [900, 0], [900, 100]]}}}
    outside = api.put("/api/cameras/lobby/analytics", json=beyond, headers=bearer)
    assert outside.status_code == 422, outside.text
    assert "analytics.zones.far: point [900, 0] is outside" in outside.text, outside.text
    changed = api.put("/api/cameras/lobby/analytics", json=line, headers=bearer)
    assert changed.status_code == 200, changed.text
    assert set(changed.json()["settings"]["lines"]) == {"door"}

    after = processed() + 2  # frames analysed with the new settings
    wait_for(lambda: processed() >= after, START_S, "the lobby's next frames")
    frame = frame_of()
    assert coloured(frame, LINE_COLOUR) > 100 and coloured(frame, ZONE_COLOUR) < 50
