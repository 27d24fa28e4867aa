"""Who may call the API and the view: the bearer token, or (without one) a loopback ``Host``;
changes as JSON only. The route dependencies that check it, and the refusals they document."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.params import Depends as Dependency
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pipeline.serve.http.models import Problem

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
BearerCredentials = Annotated[
    HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))
]
Responses = dict[int | str, dict[str, Any]]


@dataclass(frozen=True)
class Access:
    """The dependencies of a route that reads or changes, and the ``responses=`` that document
    what they and the routes refuse (each a ``Problem``)."""

    read: tuple[Dependency, ...]  # the token, or (loopback only) a loopback Host header
    change: tuple[Dependency, ...]  # as ``read``, and a JSON body
    denied: Responses  # 401 without the token, 403 for a foreign Host
    invalid: Responses  # denied, no such camera (404), invalid request (422)
    errors: Responses  # invalid, or a change that conflicts (409)
    unsupported: Responses  # a body not JSON (415) or too large (413)


def access_for(token: str | None) -> Access:
    """With a token: the bearer token; without (loopback only): a loopback Host header."""
    guarded = (Depends(require_token(token)),) if token is not None else (Depends(loopback_host),)
    denied: Responses = (
        {401: {"model": Problem}} if token is not None else {403: {"model": Problem}}
    )
    invalid = {**denied, 404: {"model": Problem}, 422: {"model": Problem}}
    return Access(
        read=guarded,
        change=(*guarded, Depends(json_content)),
        denied=denied,
        invalid=invalid,
        errors={**invalid, 409: {"model": Problem}},
        unsupported={415: {"model": Problem}, 413: {"model": Problem}},
    )


def require_token(token: str) -> Callable[[Request, BearerCredentials], None]:
    """A dependency: the request carries ``token`` as its bearer token (the page: ``?token=``)."""

    def authorised(request: Request, credentials: BearerCredentials) -> None:
        given = credentials.credentials if credentials else request.query_params.get("token", "")
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "a bearer token is required", {"WWW-Authenticate": "Bearer"})

    return authorised


def loopback_host(request: Request) -> None:
    """Without a token the server listens on loopback only; a request naming another host
    is a web page's (DNS rebinding), not a local client's."""
    if host_name(request.headers.get("host", "")) not in LOOPBACK_NAMES:
        raise HTTPException(403, "the Host header must name this machine (127.0.0.1, localhost)")


def json_content(request: Request) -> None:
    """Changes take JSON only: a form or text/plain body is what a cross-site page can send
    without asking the browser first."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise HTTPException(415, "send the body as application/json")


def host_name(host: str) -> str:
    """The name in a Host header, without its port (``[::1]:9108`` -> ``::1``)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
