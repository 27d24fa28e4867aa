"""``BodyLimit``: every request body of the app is capped before it is read.

A body that declares a ``Content-Length`` over the cap is refused (413) before any of it is
read; one without (``Transfer-Encoding: chunked``) is counted as the app reads it and refused
once it passes the cap, so at most the cap plus one chunk is ever held. uvicorn holds at most
64 KiB of a body the app has not asked for yet (it stops reading the socket), so a client that
sends 400 MiB costs the daemon about the cap, not 400 MiB. Either refusal closes the
connection: the client stops sending instead of the server reading the rest to throw away.
"""

from __future__ import annotations

from fastapi import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 64 * 1024  # a camera is a few hundred bytes of JSON


class BodyTooLarge(HTTPException):
    """A request body over the cap: 413, and the connection is closed."""

    def __init__(self, max_bytes: int):
        super().__init__(
            413,
            f"a request body is at most {max_bytes // 1024} KiB (a camera is a few hundred bytes)",
            {"Connection": "close"},
        )


class BodyLimit:
    """ASGI middleware capping every request body at ``max_bytes``.

    A refusal the app's exception handlers see (the body read by a route, or by FastAPI for a
    model) is answered by them like any ``HTTPException``; one that reaches this middleware
    before a response started is answered here."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await refuse(BodyTooLarge(self.max_bytes), scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge as exc:
            if started:
                raise
            await refuse(exc, scope, receive, send)


def content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``, or None without one (chunked) or when it is not a
    number (the HTTP parser has refused that already)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def refuse(exc: BodyTooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    """The refusal as the app's ``Problem`` body."""
    response = JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)
    await response(scope, receive, send)
