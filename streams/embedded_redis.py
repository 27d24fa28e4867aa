"""A private ``redis-server`` for the daemon (no ``redis.url`` configured) and for tests.

It never outlives its owner: ``redis-server`` runs under a small ``sh`` guard that dies with the
owner (``PR_SET_PDEATHSIG``, even when the owner is SIGKILLed), stops the server the same way
(``setpriv --pdeathsig``) and removes the server's folder once it exited.  The guard runs in a
session of its own, so a Ctrl-C at the terminal reaches only the daemon, which then finishes its
batches against a server still up.  Folders of owners that died before the guard existed are
swept at the next start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from streams.lifeline import pid_alive, tied_to_parent

START_TIMEOUT_S = 10.0
WORKDIR_PREFIX = "framebatch-redis-"
OWNER_FILE = "owner.pid"

# $0 is redis-server's command, "$@" its arguments; the folder comes in FRAMEBATCH_REDIS_DIR.
_GUARD = (
    '"$0" "$@" & server=$!\n'
    "trap 'kill -TERM \"$server\" 2>/dev/null' TERM HUP INT\n"
    'wait "$server"; status=$?\n'
    'wait "$server" 2>/dev/null\n'  # a trapped signal ends the first wait early
    'rm -rf -- "$FRAMEBATCH_REDIS_DIR"\n'
    'exit "$status"\n'
)


class RedisServerError(RuntimeError):
    pass


def free_tcp_port() -> int:
    """A port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sweep_stale_workdirs(directory: Path | None = None) -> list[Path]:
    """Remove private-server folders whose owner process is gone (a crash before cleanup)."""
    removed = []
    for workdir in Path(directory or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours to judge, or being created right now
        if not pid_alive(owner):
            shutil.rmtree(workdir, ignore_errors=True)
            removed.append(workdir)
    return removed


class EmbeddedRedis:
    """Starts ``redis-server`` without persistence on a unix socket (default) or a loopback port.

    Use as a context manager; ``stop()`` is safe to call in any state.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        bind: str = "127.0.0.1",
        executable: str = "redis-server",
        aof_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ):
        """``aof_dir``: persist with an append-only file fsynced on every write, kept there
        across restarts (tests of Redis restarts); default: no persistence.  ``extra_args``:
        more ``redis-server`` options (``--cluster-enabled yes``...).  ``bind``: the address a
        TCP ``port`` listens on (a network-namespace host's, for benchmarks across hosts)."""
        self._port = port
        self._bind = bind
        self._aof_dir = aof_dir
        self._extra_args = extra_args
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
        sweep_stale_workdirs()
        self._workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (self._workdir / OWNER_FILE).write_text(str(os.getpid()))
        if self._aof_dir is None:
            args = [binary, "--save", "", "--appendonly", "no", "--dir", str(self._workdir)]
        else:
            args = [binary, "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
            args += ["--dir", str(self._aof_dir)]
        if self._port is None:
            sock = self._workdir / "redis.sock"
            args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            self.url = f"unix://{sock}"
        else:
            args += ["--port", str(self._port), "--bind", self._bind]
            self.url = f"redis://{self._bind}:{self._port}/0"
        args += self._extra_args
        setpriv = shutil.which("setpriv")  # util-linux: the server dies with its guard
        if setpriv is not None:
            args = [setpriv, "--pdeathsig", "TERM", "--", *args]
        self._process = subprocess.Popen(
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "FRAMEBATCH_REDIS_DIR": str(self._workdir)},
            start_new_session=True,
            **tied_to_parent(["/bin/sh", "-c", _GUARD, *args]),  # the guard dies with us
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

    def crash(self) -> None:
        """SIGKILL of redis-server itself (a crash: no shutdown, no final write), then
        stopped; what ``aof_dir`` kept is what the next start finds."""
        process = self._process
        if process is not None:
            children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
            for pid in children.read_text().split() if children.exists() else []:
                os.kill(int(pid), signal.SIGKILL)  # the server; its guard then exits
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # stop() ends the guard
        self.stop()

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
