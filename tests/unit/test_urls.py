"""Source URL helpers: scheme, live or file, and printing without the password."""

from __future__ import annotations

import pytest

from streams.urls import is_live_url, redact_url, url_scheme


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("rtsp://cam/stream", "rtsp"),
        ("RTSP://cam/stream", "rtsp"),
        ("rtsps://cam:322/stream", "rtsps"),
        ("Http://example.com/live.m3u8", "http"),
        ("file:///data/clip.mp4", "file"),
        ("udp://@239.0.0.1:1234", "udp"),
        ("/data/clips/a.mp4", ""),
        ("clips/a.mp4", ""),
        ("C:\\clips\\a.mp4", ""),
        ("rtsp:/cam/stream", ""),  # not a URL without the double slash
        ("", ""),
    ],
)
def test_url_scheme(url: str, scheme: str) -> None:
    assert url_scheme(url) == scheme


@pytest.mark.parametrize(
    ("url", "live"),
    [
        ("rtsp://10.0.0.5:554/h264", True),
        ("rtsps://cam/x", True),
        ("rtmp://server/app/key", True),
        ("http://cam/mjpeg", True),
        ("HTTPS://cam/hls.m3u8", True),
        ("udp://@239.0.0.1:1234", True),
        ("srt://host:9000", True),
        ("file:///data/clip.mp4", False),
        ("/data/clip.mp4", False),
        ("samples/clips/street.mp4", False),
        ("ftp://host/clip.mp4", False),
        ("rtspx://host/x", False),
        ("", False),
    ],
)
def test_is_live_url(url: str, live: bool) -> None:
    assert is_live_url(url) is live


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("rtsp://user:secret@host/x", "rtsp://user:***@host/x"),
        (
            "rtsp://admin:p4ss@10.0.0.5:554/Streaming/101",
            "rtsp://admin:***@10.0.0.5:554/Streaming/101",
        ),
        ("rtsp://u:s3cr%40t@cam/x?channel=1#f", "rtsp://u:***@cam/x?channel=1#f"),
        ("rtsp://u:p@ss@cam/x", "rtsp://u:***@cam/x"),  # '@' inside the password
        ("rtsp://u:p:a:ss@cam/x", "rtsp://u:***@cam/x"),  # ':' inside the password
        ("rtsp://u:@cam/x", "rtsp://u:***@cam/x"),  # empty password is still a password
        ("rtsp://:secret@cam/x", "rtsp://:***@cam/x"),  # password without user
        ("https://u:tok@example.com:8443/live.m3u8", "https://u:***@example.com:8443/live.m3u8"),
        ("RTSP://u:secret@cam/x", "RTSP://u:***@cam/x"),
        ("rtsp://u:p@[::1]:554/x", "rtsp://u:***@[::1]:554/x"),  # IPv6 brackets kept
        ("rtsp://u:p@cam:abc/x", "rtsp://u:***@cam:abc/x"),  # malformed port: still redacted
        ("rtsp://u:p@cam:99999/x", "rtsp://u:***@cam:99999/x"),
        ("rtsp://u:a/b#c@cam/x", "rtsp://u:***@cam/x"),  # '/' and '#' inside the password
        # a password or token in the query (Dahua, Hikvision, HLS tokens)
        (
            "rtsp://cam/cam/realmonitor?channel=1&user=admin&password=s3cret&subtype=0",
            "rtsp://cam/cam/realmonitor?channel=1&user=admin&password=***&subtype=0",
        ),
        ("https://cdn/live.m3u8?token=abc123#x", "https://cdn/live.m3u8?token=***#x"),
        ("rtsp://u:p@cam/x?PWD=p", "rtsp://u:***@cam/x?PWD=***"),
        # unchanged: no password
        ("rtsp://admin@cam/x", "rtsp://admin@cam/x"),
        ("rtsp://cam:554/x", "rtsp://cam:554/x"),
        ("rtsp://CamHost/Path", "rtsp://CamHost/Path"),
        ("rtsp://[::1]:554/x", "rtsp://[::1]:554/x"),
        ("udp://@239.0.0.1:1234", "udp://@239.0.0.1:1234"),
        # unchanged: not URLs
        ("/data/clips/a.mp4", "/data/clips/a.mp4"),
        ("user:secret@host", "user:secret@host"),
        ("", ""),
        # inside a longer text (an error message): each URL redacted, the rest kept
        (
            "camera 'a' (rtsp://u:pw@cam/x): cannot open: rtsp://u:pw@cam/x: Connection refused",
            "camera 'a' (rtsp://u:***@cam/x): cannot open: rtsp://u:***@cam/x: Connection refused",
        ),
        (
            "rtsp://a:one@h1/x and rtmp://b:two@h2/y",
            "rtsp://a:***@h1/x and rtmp://b:***@h2/y",
        ),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


@pytest.mark.parametrize(
    "url",
    [
        "rtsp://user:hunter2@cam/x",
        "rtsp://user:hunter2@cam:554/x",
        "rtmp://user:hunter2@server/app",
        "srt://user:hunter2@host:9000",
    ],
)
def test_redacted_url_never_contains_the_password(url: str) -> None:
    assert "hunter2" not in redact_url(url)
    assert is_live_url(redact_url(url)) is is_live_url(url)
