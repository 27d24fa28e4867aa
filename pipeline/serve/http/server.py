"""Serving the app: the listening socket (``bind``) and uvicorn on a thread (``HttpServer``)."""

from __future__ import annotations

import logging
import socket
import threading

import uvicorn
from fastapi import FastAPI

from pipeline.config import split_listen

log = logging.getLogger(__name__)

SERVER_STOP_S = 5.0


def bind(listen: str) -> socket.socket:
    """The listening socket, bound here so a taken port is a start-up error naming the
    setting (exit 2), not a log line from a thread."""
    host, port = split_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"http.listen {listen}: cannot listen there ({exc.strerror})") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


class HttpServer:
    """uvicorn on a thread, on a socket bound before (``bind``); ``close`` stops it."""

    def __init__(
        self,
        app: FastAPI,
        sock: socket.socket,
        serves: str = "metrics, health, API and live view",
    ):
        """``serves``: what the endpoint offers, for the log line that gives its address."""
        self._sock = sock
        self._serves = serves
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # its records go to the daemon's own handlers and format
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fb-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self) -> None:
        self._thread.start()
        log.info("http: %s on %s", self._serves, self.url)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(SERVER_STOP_S)
        self._sock.close()
