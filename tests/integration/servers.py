"""Real servers the output tests talk to, each a process on a free loopback port with its files
in a folder of the test's: started, stopped with SIGTERM (what a restart does), restarted."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from streams.embedded_redis import free_tcp_port
from tests.integration.runner import wait_for


class LoopbackServer:
    """``command()`` run in ``folder``, its output in ``<name>.log`` there."""

    name = "server"

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_tcp_port()
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        log = open(self.folder / f"{self.name}.log", "ab")  # noqa: SIM115 (the process keeps it)
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=self.folder
        )
        log.close()

        def listening() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log()
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, 10, f"{self.name} to listen")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # it saves its state (sessions, streams)
            self.process.wait(10)
        self.process = None

    def log(self) -> str:
        return (self.folder / f"{self.name}.log").read_text(errors="replace")
