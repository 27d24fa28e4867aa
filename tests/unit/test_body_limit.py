"""``BodyLimit``: a body over the cap is refused by its declared length before it is read, or
while it streams once past the cap; what is under the cap reaches the route whole."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from pipeline.serve.http.app import problem
from pipeline.serve.http.limits import BodyLimit

CAP = 1024
PIECE = 256


class Priority(BaseModel):
    priority: int


def capped_app() -> BodyLimit:
    """A route that reads its body itself, one FastAPI reads for a model, as in ``build_app``."""
    app = FastAPI()

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"length": len(await request.body())}

    @app.patch("/model")
    def model(change: Priority) -> dict[str, int]:
        return {"priority": change.priority}

    app.add_exception_handler(HTTPException, problem)
    return BodyLimit(app, max_bytes=CAP)


@dataclass
class Exchange:
    """One request through the ASGI app: what it read of the body, what it answered."""

    pieces: list[bytes]
    pulled: int = 0  # pieces the app asked for
    messages: list[dict[str, Any]] = field(default_factory=list)

    async def receive(self) -> dict[str, Any]:
        if self.pulled >= len(self.pieces):
            return {"type": "http.request", "body": b"", "more_body": False}
        self.pulled += 1
        more = self.pulled < len(self.pieces)
        return {"type": "http.request", "body": self.pieces[self.pulled - 1], "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def body(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.messages[1:]))


def call(method: str, path: str, pieces: list[bytes], length: int | None) -> Exchange:
    headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    exchange = Exchange(pieces)
    asyncio.run(capped_app()(scope, exchange.receive, exchange.send))
    return exchange


def json_pieces(size: int) -> list[bytes]:
    """A JSON object of ``size`` bytes, in ``PIECE``-byte pieces."""
    body = b'{"priority": 1, "pad": "' + b"x" * (size - 26) + b'"}'
    assert len(body) == size
    return [body[i : i + PIECE] for i in range(0, size, PIECE)]


@pytest.mark.parametrize(
    ("method", "path", "size", "declared", "status", "pulled_at_most"),
    [
        # a declared length over the cap: refused before a byte of the body is read
        ("POST", "/raw", 400 * 1024 * 1024, 400 * 1024 * 1024, 413, 0),
        ("PATCH", "/model", CAP + 1, CAP + 1, 413, 0),
        # no length (chunked): refused at the piece that passes the cap
        ("POST", "/raw", 100 * CAP, None, 413, CAP // PIECE + 1),
        ("PATCH", "/model", 100 * CAP, None, 413, CAP // PIECE + 1),
        # a length that lies (smaller than what comes): counted all the same
        ("POST", "/raw", 100 * CAP, 10, 413, CAP // PIECE + 1),
        # at the cap: read whole
        ("POST", "/raw", CAP, CAP, 200, CAP // PIECE),
        ("PATCH", "/model", CAP, None, 200, CAP // PIECE),
    ],
    ids=[
        "declared-400MiB",
        "declared-patch",
        "chunked",
        "chunked-patch",
        "length-understated",
        "at-cap",
        "at-cap-patch",
    ],
)
def test_bodies_are_capped_before_and_while_they_are_read(
    method, path, size, declared, status, pulled_at_most
):
    pieces = json_pieces(size) if size <= 100 * CAP else [b"x" * PIECE] * 4
    exchange = call(method, path, pieces, declared)
    assert exchange.status == status, exchange.messages
    assert exchange.pulled <= pulled_at_most
    if status == 413:
        assert "1 KiB" in exchange.body["detail"]
        assert exchange.headers[b"connection"] == b"close"  # the client stops sending
    elif path == "/raw":
        assert exchange.body == {"length": size}
    else:
        assert exchange.body == {"priority": 1}
