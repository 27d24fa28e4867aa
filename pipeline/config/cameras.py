"""A ``cameras`` entry: one video source, an RTSP stream or a video file."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from pipeline.config.analytics import AnalyticsConfig
from pipeline.config.errors import clip, fail, fail_at
from pipeline.config.fields import MODEL_CONFIG, Finite, key_part, resolve_path
from streams.sampling import DecodeFrames
from streams.sources import MAX_FPS, MIN_FPS
from streams.urls import is_live_url, redact_url, url_scheme

#: URL schemes a camera may use; anything without ``scheme://`` is a file path.
CAMERA_SCHEMES = ("rtsp", "rtsps")
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


class CameraConfig(BaseModel):
    """One video source: an RTSP stream or a video file."""

    model_config = MODEL_CONFIG
    id: str = Field(description="Camera id, 1-64 of [A-Za-z0-9_.-]; part of Redis keys")
    url: str = Field(description="rtsp:// or rtsps:// URL, or a file path (file:// allowed)")
    realtime: bool | None = Field(None, description="Pace file playback at the clip's frame rate")
    as_live: bool = Field(
        False,
        description="A file replayed as the live camera it stands for: at its frame rate, "
        "shedding the frames not detected in time (counted as drops), with --until-done too",
    )
    loop: bool = Field(False, description="Restart a file at its end (files only)")
    fps: Finite | None = Field(
        None, ge=MIN_FPS, le=MAX_FPS, description="Override of the pacing / frame rate"
    )
    max_backlog: int | None = Field(None, ge=1, description="Frames queued before drop or block")
    vid_stride: int = Field(
        1, ge=1, le=1000, description="Detect on every n-th decoded frame (others: sampled_out)"
    )
    max_fps: Finite | None = Field(
        None,
        ge=MIN_FPS,
        le=MAX_FPS,
        description="Detect on at most this many frames a second of stream time "
        "(others: sampled_out)",
    )
    decode_frames: DecodeFrames = Field(
        "auto",
        description="which packets of a camera sampled by max_fps are never decoded (counted "
        "sampled_out): needed: all but what the frames taken need (the same frames as all); "
        "keyframes: all but key frames; auto: keyframes once the measured key-frame interval "
        "gives what max_fps asks for, needed before that; all: none",
    )
    priority: int = Field(
        0, ge=0, le=9, description="Priority level; 0 is served first and shed last"
    )
    decode_weight: Finite = Field(
        1.0,
        gt=0,
        le=1000,
        description="What decoding this camera costs, in the unit of decoding.worker_capacity "
        "(a decode worker takes cameras up to its capacity; default 1: capacity counts cameras)",
    )
    max_wait_frames: Finite | None = Field(
        None, gt=0, description="Overrides batching.max_wait_frames"
    )
    max_wait_ms: Finite | None = Field(None, ge=0, description="Overrides batching.max_wait_ms")
    max_frame_age_ms: Finite | None = Field(
        None, gt=0, description="Freshness deadline from capture; later frames drop as stale"
    )
    keep_latest: bool = Field(False, description="Only the newest frame matters; older ones drop")
    analytics: AnalyticsConfig | None = Field(
        None, description="Filters, masks, tracking, zones and lines; unset: boxes as detected"
    )

    @field_validator("id")
    @classmethod
    def _check_id(cls, camera_id: str) -> str:
        return key_part(camera_id, "camera id", 64)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str, info: ValidationInfo) -> str:
        if _CONTROL_CHARACTERS.search(url):  # a newline would forge log lines, a NUL cut paths
            raise fail("must not contain control characters (newlines, NUL...)")
        scheme = url_scheme(url) or None
        if scheme in CAMERA_SCHEMES:
            # (the URL is not echoed: redaction cannot be trusted on a URL that does not parse)
            try:
                host = urlsplit(url).hostname
            except ValueError as exc:
                raise fail(f"not a valid URL ({exc})") from None
            if not host:
                raise fail(f"no host in the {scheme}:// URL")
            return url
        if scheme == "file":
            rest = url[len("file://") :]
            url = unquote(rest[len("localhost") :] if rest.startswith("localhost/") else rest)
        elif scheme is not None:
            raise fail(
                f"unsupported URL scheme {clip(scheme)!r} in {clip(redact_url(url))!r} "
                "(expected rtsp://, rtsps:// or a file path)"
            )
        if not url.strip():
            raise fail("must not be empty")
        if _CONTROL_CHARACTERS.search(url):  # %0A, %00 in a file:// URL
            raise fail("must not contain control characters (newlines, NUL...)")
        return str(resolve_path(Path(url), info))

    @model_validator(mode="after")
    def _check_loop(self) -> CameraConfig:
        for field, value in (("loop", self.loop), ("as_live", self.as_live)):
            if value and self.is_live:
                source = clip(redact_url(self.url))
                message = f"{field} is only for files; {source!r} is a live source"
                raise fail_at(type(self).__name__, [((field,), message, True)])
        if self.as_live and self.realtime is False:
            message = "as_live replays the file at its frame rate: leave realtime unset or true"
            raise fail_at(type(self).__name__, [(("realtime",), message, False)])
        return self

    @property
    def paced(self) -> bool:
        """Frames come at the source's own pace: a live camera, or a file replayed in real
        time (``realtime``, ``as_live``)."""
        return self.is_live or self.as_live or bool(self.realtime)

    @property
    def is_live(self) -> bool:
        """True for network streams (rtsp, rtsps, rtmp, http(s), udp), False for files."""
        return is_live_url(self.url)
