"""A private ``redis-server`` for the daemon (no ``redis.url`` configured) and for tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

START_TIMEOUT_S = 10.0


class RedisServerError(RuntimeError):
    pass


def free_tcp_port() -> int:
    """A port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedRedis:
    """Starts ``redis-server`` without persistence on a unix socket (default) or a loopback port.

    Use as a context manager; ``stop()`` is safe to call in any state.
    """

    def __init__(self, *, port: int | None = None, executable: str = "redis-server"):
        self._port = port
        self._executable = executable
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self.url = ""

    def start(self) -> EmbeddedRedis:
        binary = shutil.which(self._executable)
        if binary is None:
            raise RedisServerError(
                f"{self._executable!r} not found: install Debian's redis-server "
                "or set redis.url in the config"
            )
        self._workdir = Path(tempfile.mkdtemp(prefix="framebatch-redis-"))
        args = [binary, "--save", "", "--appendonly", "no", "--dir", str(self._workdir)]
        if self._port is None:
            sock = self._workdir / "redis.sock"
            args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            self.url = f"unix://{sock}"
        else:
            args += ["--port", str(self._port), "--bind", "127.0.0.1"]
            self.url = f"redis://127.0.0.1:{self._port}/0"
        self._process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis.from_url(self.url)
        try:
            while time.monotonic() < deadline:
                if self._process is not None and self._process.poll() is not None:
                    stderr = (
                        self._process.stderr.read().decode(errors="replace")
                        if self._process.stderr
                        else ""
                    )
                    raise RedisServerError(f"redis-server exited at start: {stderr.strip()}")
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, FileNotFoundError):
                    time.sleep(0.02)
        finally:
            client.close()
        self.stop()
        raise RedisServerError(f"redis-server did not answer within {START_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process is not None and process.stderr is not None:
            process.stderr.close()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
