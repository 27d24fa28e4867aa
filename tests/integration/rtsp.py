"""Start the loopback RTSP test server (``rtsp_server.py``) from pytest.

The server needs GStreamer's RTSP server through PyGObject, which only the system
interpreter has, so it runs as a ``/usr/bin/python3`` subprocess.
"""

from __future__ import annotations

import functools
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
SERVER_SCRIPT = Path(__file__).resolve().with_name("rtsp_server.py")

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
    cmd = [SYSTEM_PYTHON, str(SERVER_SCRIPT), "--port", str(port or 0), "--mount", mount]
    cmd += ["--file", str(clip)]
    if max_frames is not None:
        cmd += ["--max-frames", str(max_frames)]
    # stderr goes to a file, not a pipe: nobody drains it while the test runs, and a
    # full pipe would stall the server.
    with tempfile.TemporaryFile(mode="w+", prefix="rtsp_server_", suffix=".log") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=_system_env()
        )
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc, lines), daemon=True)
        reader.start()
        try:
            url, eof = _wait_ready(lines, timeout_s)
            if url is None:
                if eof:  # stdout closed: the server is exiting on its own
                    proc.wait(5)
                why = (
                    f"exited with code {proc.poll()}"
                    if eof
                    else f"not ready within {timeout_s:.0f}s"
                )
                _stop(proc)
                log.seek(0)
                raise RuntimeError(f"RTSP server {why}: {' '.join(cmd)}\n{log.read().strip()}")
            yield url
        finally:
            _stop(proc)
            reader.join(5)  # the server is gone, so its stdout is at EOF


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
