"""The downloader (``detectors.downloads``) against a real HTTP server on 127.0.0.1 that fails
the first requests in a chosen way: what is retried (and with which backoff), what is not, that
nothing but a verified file is ever left behind, and that an unreachable server is known at
once, without retries, so fetching several files stops after the first."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from detectors.downloads import (
    ASSETS_ENV,
    AssetsFolder,
    FetchError,
    NotFetched,
    Unreachable,
    check_reachable,
    download_verified,
    locate_assets,
)
from samples.clips import REAL_CLIPS, fetch_real_clips
from streams.embedded_redis import free_tcp_port

BODY = b"framebatch test payload " * 4096  # 96 KiB: more than one read chunk
BODY_SHA256 = hashlib.sha256(BODY).hexdigest()


@dataclass
class Script:
    """How the server answers: the first ``failures`` requests fail as ``how``, then it
    serves ``BODY``."""

    failures: int = 0
    how: str = "503"  # an HTTP status, or "cut": the headers promise more than is sent
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            script.requests.append(self.path)
            if len(script.requests) <= script.failures:
                if script.how == "cut":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(BODY)))
                    self.end_headers()
                    self.wfile.write(BODY[:1000])
                    self.close_connection = True
                    return
                self.send_error(int(script.how))
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()
    httpd.server_close()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("how", ["503", "429", "500", "cut"])
def test_a_transient_failure_is_retried_with_a_doubling_backoff(server, tmp_path, how):
    base, script = server
    script.failures, script.how = 2, how
    said: list[str] = []
    target = tmp_path / "file.bin"
    download_verified(
        f"{base}/file.bin", target, BODY_SHA256, what="file", backoff_s=0.01, say=said.append
    )
    assert target.read_bytes() == BODY
    assert len(script.requests) == 3
    assert [line.split(" in ")[1].split(" ")[0] for line in said] == ["0.01", "0.02"]
    assert leftovers(tmp_path) == ["file.bin"]


def test_retries_run_out_with_one_line_and_leave_nothing(server, tmp_path):
    base, script = server
    script.failures = 99
    with pytest.raises(FetchError, match=r"failed: HTTP 503 Service Unavailable \(3 tries\)$"):
        download_verified(
            f"{base}/file.bin", tmp_path / "file.bin", BODY_SHA256, what="file", backoff_s=0.01
        )
    assert len(script.requests) == 3
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("how", ["404", "403"])
def test_a_permanent_http_error_is_not_retried(server, tmp_path, how):
    base, script = server
    script.failures, script.how = 99, how
    with pytest.raises(FetchError, match=f"from {base}/file.bin failed: HTTP {how} "):
        download_verified(f"{base}/file.bin", tmp_path / "file.bin", BODY_SHA256, what="file")
    assert len(script.requests) == 1
    assert leftovers(tmp_path) == []


def test_a_sha256_mismatch_is_not_retried_and_leaves_no_file(server, tmp_path):
    base, script = server
    target = tmp_path / "file.bin"
    target.write_bytes(b"old content")  # a stale file: replaced only by a verified one
    with pytest.raises(FetchError, match=f"has sha256 {BODY_SHA256}, expected 0+: not kept"):
        download_verified(f"{base}/file.bin", tmp_path / "new.bin", "0" * 64, what="file")
    assert len(script.requests) == 1
    assert leftovers(tmp_path) == ["file.bin"]  # no new.bin, no .new.bin.part


def test_a_closed_port_is_unreachable_at_once_without_retries(tmp_path):
    port = free_tcp_port()  # nothing listens there
    began = time.monotonic()
    with pytest.raises(Unreachable, match=f"^127.0.0.1:{port} unreachable \\(Connection refused"):
        download_verified(
            f"http://127.0.0.1:{port}/f", tmp_path / "f", BODY_SHA256, what="f", backoff_s=5
        )
    assert time.monotonic() - began < 2  # no backoff slept
    assert leftovers(tmp_path) == []


def test_a_proxy_that_is_down_is_named(tmp_path, monkeypatch):
    port = free_tcp_port()
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with pytest.raises(Unreachable, match=f"the proxy 127.0.0.1:{port} \\(\\$https_proxy\\)"):
        check_reachable("https://example.invalid/file")  # never resolved: the proxy is asked


def test_a_name_server_that_never_answers_costs_the_timeout_only(monkeypatch):
    """getaddrinfo takes no timeout; the probe's own thread bounds it (a fake connect that
    hangs stands in for an unanswering name server)."""
    release = threading.Event()

    def hang(address: tuple[str, int], timeout: float) -> socket.socket:
        release.wait(10)
        raise OSError("released")

    monkeypatch.setattr(socket, "create_connection", hang)
    began = time.monotonic()
    try:
        with pytest.raises(Unreachable, match=r"^example.org:443 unreachable \(no answer within"):
            check_reachable("https://example.org/x", timeout_s=0.2)
        assert time.monotonic() - began < 1
    finally:
        release.set()


def test_fetching_clips_stops_downloading_at_the_first_unreachable_server(tmp_path):
    dead = f"http://127.0.0.1:{free_tcp_port()}"
    said: list[str] = []
    began = time.monotonic()
    with pytest.raises(NotFetched) as caught:
        fetch_real_clips(
            tmp_path / "real",
            assets_dir=AssetsFolder(tmp_path / "nowhere", f"${ASSETS_ENV}"),
            allow_download=True,
            mirror=dead,
            log=said.append,
        )
    assert time.monotonic() - began < 2
    assert said == [f"download   {dead}/{REAL_CLIPS[0].filename}"]  # one try, not four
    error = caught.value
    assert error.download_failed
    assert error.lines() == [
        f"4 of 4 sample clips missing in {tmp_path / 'real'}",
        f"looked in: {tmp_path / 'nowhere' / 'videos'} (from ${ASSETS_ENV}: no such folder)",
        f"download failed: {dead[7:]} unreachable (Connection refused); nothing more downloaded",
        f"point elsewhere: --assets PATH or {ASSETS_ENV}=PATH (a folder holding videos/)",
        "fetch when online: python -m samples.clips fetch",
    ]
    assert not (tmp_path / "real").exists() or leftovers(tmp_path / "real") == []


def test_without_downloads_a_missing_clip_is_bad_input(tmp_path):
    with pytest.raises(NotFetched) as caught:
        fetch_real_clips(tmp_path / "real", assets_dir=None, allow_download=False)
    assert not caught.value.download_failed
    assert caught.value.lines()[1:3] == [
        "looked in: no assets folder (none given)",
        "not downloaded: downloads are off (--no-download)",
    ]


def test_the_assets_folder_comes_from_the_flag_then_the_environment_then_the_clone(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    env = {ASSETS_ENV: "/from/env"}
    assert locate_assets(clone, Path("/flag"), env) == AssetsFolder(Path("/flag"), "--assets")
    assert locate_assets(clone, None, env) == AssetsFolder(Path("/from/env"), f"${ASSETS_ENV}")
    # an installed package (no pyproject.toml beside it) has no clone to look beside
    assert locate_assets(clone, None, {}).path is None
    (clone / "pyproject.toml").write_text("")
    assert locate_assets(clone, None, {}).path == tmp_path / "shared" / "assets"


def test_many_causes_are_cut_to_two_lines():
    error = NotFetched(
        "what",
        looked_in="here",
        failures=["a", "b", "a", "c", "d"],
        elsewhere="there",
        fetch_command="cmd",
        download_failed=True,
    )
    assert error.lines() == [
        "what",
        "looked in: here",
        "a",
        "b",
        "... and 2 more",
        "point elsewhere: there",
        "fetch when online: cmd",
    ]
