"""Replay a clip as a live RTSP camera on loopback (``rtsp_replay_server.py``), for tests,
the fault-injection harness and trying framebatch without a camera.

The server needs GStreamer's RTSP server through PyGObject (Debian's
``gir1.2-gst-rtsp-server-1.0``, ``python3-gi`` and GStreamer plugins), which only the system
interpreter has, so it runs as a ``/usr/bin/python3`` subprocess.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streams.lifeline import tied_to_parent

SYSTEM_PYTHON = "/usr/bin/python3"
SERVER_SCRIPT = Path(__file__).resolve().with_name("rtsp_replay_server.py")

_PROBE = """
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import Gst, GstRtspServer
Gst.init(None)
missing = [e for e in ("appsrc", "decodebin", "videoconvert", "appsink", "x264enc",
                       "rtph264pay") if Gst.ElementFactory.find(e) is None]
if missing:
    raise SystemExit("missing GStreamer elements: " + ", ".join(missing))
"""


def _system_env() -> dict[str, str]:
    """Environment for the system interpreter, without the venv's Python settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    env.pop("VIRTUAL_ENV", None)
    return env


@functools.cache
def rtsp_server_available() -> tuple[bool, str]:
    """Whether ``/usr/bin/python3`` can run the server; the reason if it cannot."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return False, f"{SYSTEM_PYTHON} not found"
    try:
        proc = subprocess.run(
            [SYSTEM_PYTHON, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=30,
            env=_system_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot probe {SYSTEM_PYTHON}: {exc}"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit code {proc.returncode}"
        return False, f"{SYSTEM_PYTHON} lacks GStreamer RTSP server support: {detail}"
    return True, "ok"


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RtspReplay:
    """A replay server that can be killed and started again on the same port (fault tests).

    ``start()`` returns the ``rtsp://127.0.0.1:PORT/MOUNT`` URL; with ``port=None`` the OS
    chooses the port at the first start and later starts reuse it."""

    def __init__(
        self,
        clip: Path,
        *,
        port: int | None = None,
        mount: str = "/cam1",
        timeout_s: float = 30.0,
        max_frames: int | None = None,
    ):
        self.clip, self.port, self.mount = clip, port, mount
        self._timeout_s, self._max_frames = timeout_s, max_frames
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._log: tempfile._TemporaryFileWrapper[str] | None = None
        self.url = ""

    def start(self) -> str:
        cmd = [SYSTEM_PYTHON, str(SERVER_SCRIPT), "--port", str(self.port or 0)]
        cmd += ["--mount", self.mount, "--file", str(self.clip)]
        if self._max_frames is not None:
            cmd += ["--max-frames", str(self._max_frames)]
        # stderr goes to a file, not a pipe: nobody drains it while the server runs, and a
        # full pipe would stall it
        self._log = tempfile.NamedTemporaryFile(  # closed by stop()
            mode="w+", prefix="rtsp_replay_", suffix=".log"
        )
        proc = subprocess.Popen(
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=_system_env(),
            **tied_to_parent(cmd),  # it never outlives whoever started it
        )
        self._proc = proc
        lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=_pump, args=(proc, lines), daemon=True)
        self._reader.start()
        url, eof = _wait_ready(lines, self._timeout_s)
        if url is None:
            if eof:  # stdout closed: the server is exiting on its own
                proc.wait(5)
            why = f"exited with code {proc.poll()}" if eof else "not ready in time"
            self._log.seek(0)
            detail = self._log.read().strip()
            self.stop()
            raise RuntimeError(f"RTSP server {why}: {' '.join(cmd)}\n{detail}")
        self.url = url
        self.port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        return url

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Signal the server (SIGKILL: a crash; SIGTERM: an orderly stop) and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signum)
        self.stop()

    def stop(self) -> None:
        """Legal in every state."""
        if self._proc is not None:
            _stop(self._proc)
            self._proc = None
        if self._reader is not None:
            self._reader.join(5)  # the server is gone, so its stdout is at EOF
            self._reader = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> RtspReplay:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextmanager
def serve_rtsp(
    clip: Path,
    *,
    port: int | None = None,
    mount: str = "/cam1",
    timeout_s: float = 30.0,
    max_frames: int | None = None,
) -> Iterator[str]:
    """Serve ``clip`` in an endless loop; yield its ``rtsp://127.0.0.1:PORT/MOUNT`` URL.

    With ``port=None`` the server binds port 0 and reports the port the OS chose, which
    avoids the race of probing for a free port and then binding it in another process.
    """
    with RtspReplay(
        clip, port=port, mount=mount, timeout_s=timeout_s, max_frames=max_frames
    ) as server:
        yield server.url


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Forward the server's stdout lines to ``lines``; None marks EOF."""
    # readline blocks, so it runs in a thread; the thread also owns closing the pipe.
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            lines.put(line)
    lines.put(None)


def _wait_ready(lines: queue.Queue[str | None], timeout_s: float) -> tuple[str | None, bool]:
    """Return (URL from the READY line or None, whether stdout reached EOF)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            return None, True
        if line.startswith("READY "):
            return line.split(maxsplit=1)[1].strip(), False
    return None, False
