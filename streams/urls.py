"""Source URL helpers: which URLs are live cameras, and how to print one without its password."""

from __future__ import annotations

import re

LIVE_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "http", "https", "udp", "srt"})

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# user info up to the LAST "@" before white space, so passwords with "@", "/", "#" or ":" hide too
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^\s:/@]*):\S*@")
# credentials some cameras take in the query (Dahua, Hikvision: ?user=admin&password=...)
_QUERY_SECRET = re.compile(r"(?i)([?&;](?:password|passwd|pwd|pass|token|auth|key)=)[^&#\s]*")


def url_scheme(url: str) -> str:
    """The lower-case scheme, or ``""`` for a plain file path."""
    match = _SCHEME.match(url)
    return match.group(1).lower() if match else ""


def is_live_url(url: str) -> bool:
    """True for network cameras (RTSP and friends); False for file paths."""
    return url_scheme(url) in LIVE_SCHEMES


def redact_url(text: str) -> str:
    """``rtsp://user:secret@host/x`` -> ``rtsp://user:***@host/x``, also inside a longer text;
    a password or token in the query string (``?password=secret``) too."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1:***@", text))
