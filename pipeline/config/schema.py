"""The framebatch config's pydantic models: every setting, its bounds and its description.

Declared once, validated once. Every error is a line ``dotted.path: message`` and no message
ever shows a password from a URL. Validators do no I/O: relative paths are joined to the
config file's folder (passed as validation context ``base_dir``) but never checked on disk.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args
from urllib.parse import unquote, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails
from pydantic_core.core_schema import ErrorType

from detectors.backends import backend_names, suffixes
from detectors.catalog import KNOWN_MODELS, known_name, model_path
from pipeline.batching.policies import (
    DEFAULT_POLICY,
    PolicyOptions,
    policy_names,
    policy_options_models,
    policy_settings,
)
from pipeline.config.errors import (
    Problem,
    clip,
    fail,
    fail_at,
)
from streams.redis_connect import DEFAULT_RECONNECT_TIMEOUT_S
from streams.sinks import DEFAULT_SINK, default_sinks, sink_options_models
from streams.sources import MAX_FPS, MIN_FPS
from streams.urls import is_live_url, redact_url, url_scheme

#: Model file suffix -> backend name used by ``backend: auto`` (the detectors' own map).
MODEL_SUFFIXES: dict[str, str] = suffixes()
#: ``model.backend``: auto, or a module of ``detectors/backends`` (a new module is a new choice)
BackendName = Literal[("auto", *backend_names())]  # type: ignore[valid-type]
_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")
#: URL schemes a camera may use; anything without ``scheme://`` is a file path.
CAMERA_SCHEMES = ("rtsp", "rtsps")

#: One decode process per camera: past this, split the cameras across daemons.
MAX_CAMERAS_PER_DAEMON = 64
_KEY_PART = re.compile(r"[A-Za-z0-9_.-]+")
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

Finite = Annotated[float, Field(allow_inf_nan=False)]
ClassIds = Annotated[list[Annotated[int, Field(ge=0, le=999)]], Field(min_length=1)]
#: A ``sinks:`` entry: the options of the sink its ``kind`` names (one module each).
SinkSettings = Annotated[Union[sink_options_models()], Field(discriminator="kind")]  # noqa: UP007


def _resolve(path: Path, info: ValidationInfo) -> Path:
    """Join a relative path to the ``base_dir`` validation context, if any (no disk access)."""
    base_dir = (info.context or {}).get("base_dir")
    return Path(base_dir) / path if base_dir is not None and not path.is_absolute() else path


def _key_part(value: str, what: str, max_len: int) -> str:
    if len(value) > max_len or not _KEY_PART.fullmatch(value):
        raise fail(
            f"invalid {what} {clip(value)!r}: use 1-{max_len} letters, digits, '_', '.' or '-' "
            "(it becomes part of Redis keys)"
        )
    return value


class RedisConfig(BaseModel):
    """Where frames and detections live."""

    model_config = _MODEL_CONFIG
    url: str | None = Field(None, description="redis:// URL; unset: start a private redis-server")
    prefix: str = Field("fb", description="Key prefix: <prefix>:frames:{<camera>}, ...")
    frames_maxlen: int = Field(64, ge=2, description="MAXLEN ~ of each frames stream")
    detections_maxlen: int = Field(100_000, ge=1, description="MAXLEN ~ of each detections stream")
    reconnect_timeout_s: Finite = Field(
        DEFAULT_RECONNECT_TIMEOUT_S,
        ge=0,
        le=86_400,
        description="How long every process rides out a Redis outage (retrying with backoff)",
    )
    cluster: bool = Field(
        False,
        description="redis.url is a node of a Redis Cluster (each camera's keys share a hash "
        "slot: {camera} tags; the others are found from it)",
    )
    lease_ttl_s: Finite = Field(
        5.0,
        ge=0.5,
        le=600,
        description="framebatch detect: camera lease TTL (dead workers' cameras move in TTL + 1 s)",
    )

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, prefix: str) -> str:
        return _key_part(prefix, "key prefix", 64)

    @model_validator(mode="after")
    def _cluster_needs_url(self) -> RedisConfig:
        if self.cluster and not self.url:
            raise fail("cluster: true needs url: a node of the Redis Cluster to use")
        return self


class ModelConfig(BaseModel):
    """The detector model and its post-processing."""

    model_config = _MODEL_CONFIG
    path: Path = Field(
        description="Model file (relative paths are relative to the config file), or a known "
        "model's name (yolov8n: the ONNX `framebatch models fetch yolov8n` put in the cache)"
    )
    backend: BackendName = Field(  # type: ignore[valid-type]
        "auto", description="auto: by file suffix (.onnx, .torchscript, .pt, .engine)"
    )
    imgsz: int = Field(640, ge=32, le=4096, multiple_of=32, description="Input size in pixels")
    rect: bool | None = Field(
        None,
        description="Rectangular inference: letterbox each frame to its minimum stride-aligned "
        "rectangle (960x540 -> 640x384) and batch frames of one shape; unset: on when the model "
        "takes any height and width (ONNX Runtime)",
    )
    conf: Finite = Field(0.25, ge=0, le=1, description="Minimum detection confidence")
    iou: Finite = Field(0.45, gt=0, le=1, description="IoU threshold of non-maximum suppression")
    max_det: int = Field(300, ge=1, description="Most detections kept per frame")
    classes: ClassIds | None = Field(None, description="Class ids to keep; unset keeps all")
    threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads for inference, shared among the instances (ORT, torch); "
        "unset: every core this process may use",
    )
    instances: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Loads of the model per detector worker, each running a batch at once on "
        "its share of the threads (Triton's instance group); unset: 2 for ONNX Runtime on a "
        "CPU with 2 or more threads, else 1",
    )
    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    devices: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        min_length=1,
        description="CUDA device ids: one detector worker per device, cameras shared among them",
    )
    half: bool = Field(False, description="FP16 weights and input (torch backends on CUDA)")
    nms: Literal["device", "host"] = Field(
        "device", description="torch/TensorRT: NMS on the device (only kept boxes come back)"
    )
    double_buffer: bool = Field(
        True, description="torch/TensorRT on CUDA: upload batch k+1 while batch k computes"
    )
    cuda_graphs: bool = Field(False, description="torch on CUDA: one CUDA graph per batch size")

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: Path, info: ValidationInfo) -> Path:
        name = known_name(path)
        if name is not None:
            return model_path(name)  # the cached ONNX `framebatch models fetch` makes
        if path.suffix.lower() not in MODEL_SUFFIXES:
            supported = ", ".join(MODEL_SUFFIXES)
            known = ", ".join(KNOWN_MODELS)
            raise fail(
                f"unsupported model file {clip(path.name)!r} (supported suffixes: {supported}; "
                f"or a known model: {known})"
            )
        return _resolve(path, info)

    @field_validator("device")
    @classmethod
    def _check_device(cls, device: str) -> str:
        if not _DEVICE.fullmatch(device):
            raise fail(f"unknown device {clip(device)!r} (expected cpu, cuda or cuda:N)")
        return device

    @model_validator(mode="after")
    def _check_devices(self) -> ModelConfig:
        problems: list[Problem] = []
        if self.devices is not None and self.device != "cpu":
            message = "set either device or devices, not both"
            problems.append((("devices",), message, self.devices))
        if self.devices is not None and len(set(self.devices)) != len(self.devices):
            problems.append((("devices",), "device ids must be unique", self.devices))
        if self.instances and self.threads and self.threads < self.instances:
            message = (
                f"{self.threads} threads cannot run {self.instances} instances (one thread "
                "each at least): raise threads or lower instances"
            )
            problems.append((("threads",), message, self.threads))
        if self.half and self.worker_devices == ["cpu"]:
            message = "FP16 needs a CUDA device (device: cuda:N); on the CPU it is slower"
            problems.append((("half",), message, self.half))
        if problems:
            raise fail_at(type(self).__name__, problems)
        return self

    @property
    def worker_devices(self) -> list[str]:
        """One entry per detector worker: ``devices`` as ``cuda:N``, else ``device`` alone."""
        if self.devices is not None:
            return [f"cuda:{index}" for index in self.devices]
        return [self.device]


class BatchingConfig(BaseModel):
    """How frames of all cameras are grouped into one inference batch.

    The chosen policy's own settings (its module's ``Options`` in
    ``pipeline/batching/policies/``) are written beside ``policy``, as in
    ``{policy: aimd, latency_target_ms: 300}``, and read as :attr:`policy_options`.
    """

    model_config = _MODEL_CONFIG
    policy: Literal[policy_names()] = Field(  # type: ignore[valid-type]
        DEFAULT_POLICY,
        description="When to dispatch a batch: a module of pipeline/batching/policies/ "
        "(see docs/batching.md)",
    )
    max_batch_size: int = Field(8, ge=1, le=256, description="Most frames per inference batch")
    max_wait_ms: Finite = Field(
        50.0,
        ge=0,
        description="Cap of every frame's wait for a batch, in ms (the timeout policy's timeout)",
    )
    max_wait_frames: Finite | None = Field(
        2.0, gt=0, description="Wait window in frame intervals of each camera's measured rate"
    )
    preferred_batch_sizes: list[int] = Field(
        default_factory=list,
        description="Sizes to dispatch at when a larger one cannot fill in time",
    )
    max_queue_frames: int | None = Field(
        None,
        ge=1,
        description="Frames held for batching, then the lowest priority drops (4 x max batch)",
    )
    max_frame_age_ms: Finite | None = Field(
        None,
        gt=0,
        description="Default freshness deadline, from capture, of cameras that may drop frames",
    )
    _policy_options: PolicyOptions = PrivateAttr()

    @property
    def policy_options(self) -> PolicyOptions:
        """The chosen policy's own settings, validated (``target_utilisation`` for adaptive,
        ``latency_target_ms`` for aimd): what ``make_policy`` takes as ``options``."""
        return self._policy_options

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _check_preferred(cls, sizes: list[int], info: ValidationInfo) -> list[int]:
        largest = info.data.get("max_batch_size", 256)
        bad = [size for size in sizes if not 1 <= size <= largest]
        if bad:
            raise fail(f"sizes must be within 1..max_batch_size ({largest}); got {bad}")
        return sorted(set(sizes))

    @model_validator(mode="wrap")
    @classmethod
    def _policy_settings(
        cls, data: Any, handler: ModelWrapValidatorHandler[BatchingConfig]
    ) -> BatchingConfig:
        """Validate the keys of the chosen policy's ``Options`` with it, reporting each error
        at the key as written (``batching.target_utilisation``) and every error at once; a
        setting of another policy is an error that names it."""
        if not isinstance(data, Mapping):
            return handler(data)  # a BatchingConfig already, or "must be a mapping"
        policy = data.get("policy", DEFAULT_POLICY)
        models = policy_options_models()
        chosen = policy if isinstance(policy, str) and policy in models else None
        own = policy_settings(chosen) if chosen else ()
        owners: dict[str, list[str]] = {}
        for name in models:
            for setting in policy_settings(name):
                owners.setdefault(setting, []).append(name)
        shared: dict[str, Any] = {}
        settings: dict[str, Any] = {}
        problems: list[InitErrorDetails] = []
        for key, value in data.items():
            if key in own:
                settings[key] = value
            elif key in cls.model_fields:
                shared[key] = value
            elif key in owners:
                if chosen:  # (with an unknown policy, that is the error, not its settings)
                    names = owners[key]
                    of = " and ".join(names) + (" policy" if len(names) == 1 else " policies")
                    message = f"a setting of the {of}; batching.policy is {chosen}"
                    problems.append(InitErrorDetails(type=fail(message), loc=(key,), input=value))
            elif chosen and (message := cls._unknown_key(key, own)):
                problems.append(InitErrorDetails(type=fail(message), loc=(), input=value))
            else:  # unknown, closest to a shared key: pydantic's error, with the same hint
                shared[key] = value
        option_errors: list[InitErrorDetails] = []
        options = None
        if chosen:
            try:
                options = models[chosen].model_validate({**settings, "name": chosen})
            except ValidationError as exc:
                option_errors = cls._details(exc)
        try:
            config = handler(shared)
        except ValidationError as exc:
            if not option_errors and not problems:
                raise
            problems = [*cls._details(exc), *option_errors, *problems]
        else:
            problems = [*option_errors, *problems]
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        config._policy_options = options
        return config

    @model_serializer(mode="wrap")
    def _flat_policy_settings(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        """The chosen policy's settings beside ``policy``, as a config file has them."""
        data = handler(self)
        data.update(self.policy_options.model_dump(mode=info.mode, exclude={"name"}))
        return data

    @staticmethod
    def _unknown_key(key: Any, own: tuple[str, ...]) -> str | None:
        """The error of an unknown key, hinting at the chosen policy's settings too; None
        where the closest key is a shared one (pydantic's own error hints at that)."""
        names = [*BatchingConfig.model_fields, *own]
        close = difflib.get_close_matches(clip(str(key)), names, n=1)
        if close and close[0] not in own:
            return None
        hint = (
            f"; did you mean {close[0]!r}?" if close else f" (expected one of: {', '.join(names)})"
        )
        return f"unknown key {clip(str(key))!r}{hint}"

    @staticmethod
    def _details(exc: ValidationError) -> list[InitErrorDetails]:
        """The errors of ``exc`` as they can be raised again together with others."""
        details = []
        for error in exc.errors(include_url=False):
            kind, loc, value = error["type"], error["loc"], error["input"]
            if kind not in get_args(ErrorType):  # our own ("config"): the message as it was
                details.append(InitErrorDetails(type=fail(error["msg"]), loc=loc, input=value))
                continue
            detail = InitErrorDetails(type=kind, loc=loc, input=value)
            if "ctx" in error:
                detail["ctx"] = error["ctx"]
            details.append(detail)
        return details


class CameraConfig(BaseModel):
    """One video source: an RTSP stream or a video file."""

    model_config = _MODEL_CONFIG
    id: str = Field(description="Camera id, 1-64 of [A-Za-z0-9_.-]; part of Redis keys")
    url: str = Field(description="rtsp:// or rtsps:// URL, or a file path (file:// allowed)")
    realtime: bool | None = Field(None, description="Pace file playback at the clip's frame rate")
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
    priority: int = Field(
        0, ge=0, le=9, description="Priority level; 0 is served first and shed last"
    )
    max_wait_frames: Finite | None = Field(
        None, gt=0, description="Overrides batching.max_wait_frames"
    )
    max_wait_ms: Finite | None = Field(None, ge=0, description="Overrides batching.max_wait_ms")
    max_frame_age_ms: Finite | None = Field(
        None, gt=0, description="Freshness deadline from capture; later frames drop as stale"
    )
    keep_latest: bool = Field(False, description="Only the newest frame matters; older ones drop")

    @field_validator("id")
    @classmethod
    def _check_id(cls, camera_id: str) -> str:
        return _key_part(camera_id, "camera id", 64)

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
        return str(_resolve(Path(url), info))

    @model_validator(mode="after")
    def _check_loop(self) -> CameraConfig:
        if self.loop and self.is_live:
            message = f"loop is only for files; {clip(redact_url(self.url))!r} is a live source"
            raise fail_at(type(self).__name__, [(("loop",), message, True)])
        return self

    @property
    def is_live(self) -> bool:
        """True for network streams (rtsp, rtsps, rtmp, http(s), udp), False for files."""
        return is_live_url(self.url)


class TransportConfig(BaseModel):
    """How frame pixels travel from the decoders to the batcher (see docs/transports.md)."""

    model_config = _MODEL_CONFIG
    kind: Literal["auto", "raw", "jpeg", "shm"] = Field(
        "auto",
        description="auto: shm where Redis is on this host, else raw; raw: pixels inline; "
        "jpeg: JPEG inline (lossy); shm: same-host shared memory",
    )
    jpeg_quality: int = Field(90, ge=1, le=100, description="jpeg: JPEG quality, 1-100")
    shm_slots: int | None = Field(
        None,
        ge=2,
        description="shm/auto: frames per camera ring; unset: the backlog + the batcher's "
        "queue + 16",
    )


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
DEFAULT_HTTP_LISTEN = "127.0.0.1:9108"


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) into its parts; ValueError says what is wrong."""
    host, sep, port = listen.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port (port 0-65535, 0: any free one), got {listen!r}")
    return host, int(port)


class HttpConfig(BaseModel):
    """The daemon's HTTP endpoint: Prometheus metrics, health probes, the camera API and the
    live view (Triton's metrics port, Frigate's API)."""

    model_config = _MODEL_CONFIG
    listen: str | None = Field(
        DEFAULT_HTTP_LISTEN,
        description="host:port to serve /metrics, /healthz, /readyz, /api and the live view "
        "on (port 0: any free one); null: no HTTP endpoint",
    )
    token: str | None = Field(
        None,
        min_length=16,
        description="Bearer token the API and the view require (use ${VAR}); required when "
        "listen is not a loopback address. /metrics and the probes stay open",
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, listen: str | None) -> str | None:
        if listen is None:
            return None
        try:
            split_listen(listen)
        except ValueError as exc:
            raise fail(clip(str(exc))) from None
        return listen

    @model_validator(mode="after")
    def _check_token(self) -> HttpConfig:
        if self.listen is not None and self.token is None and not self.loopback:
            message = (
                f"required when listen ({self.listen}) is not a loopback address: anyone who "
                "reaches it could add or remove cameras"
            )
            raise fail_at(type(self).__name__, [(("token",), message, None)])
        return self

    @property
    def loopback(self) -> bool:
        host = split_listen(self.listen)[0] if self.listen else "127.0.0.1"
        return host in LOOPBACK_HOSTS or host.startswith("127.")


class Config(BaseModel):
    """The whole framebatch config file."""

    model_config = _MODEL_CONFIG
    redis: RedisConfig = Field(default_factory=RedisConfig, description="Redis and its bounds")
    model: ModelConfig = Field(description="Detector model")
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="Batching policy")
    cameras: list[CameraConfig] = Field(
        min_length=1,
        max_length=MAX_CAMERAS_PER_DAEMON,
        description="Video sources, unique ids (one decode process each)",
    )
    transport: TransportConfig = Field(
        default_factory=TransportConfig, description="How frames travel to the batcher"
    )
    http: HttpConfig = Field(
        default_factory=HttpConfig, description="Metrics, health, camera API and live view"
    )
    sinks: list[SinkSettings] = Field(
        default_factory=default_sinks,
        min_length=1,
        max_length=8,
        description="Where detections go, each written before a frame is acknowledged "
        "(kinds: one per module in streams/sinks/); default: redis_streams",
    )

    @model_validator(mode="after")
    def _check_sinks(self) -> Config:
        # a restart accounts for an earlier run's frames from the detections streams
        # (pipeline/ledger/earlier_runs.py): without them published frames would count as lost
        if not any(sink.kind == DEFAULT_SINK for sink in self.sinks):
            message = (
                f"must include {{kind: {DEFAULT_SINK}}}: the accounting of a run after a crash "
                "reads the detections streams"
            )
            raise fail_at(type(self).__name__, [(("sinks",), message, None)])
        return self

    @model_validator(mode="after")
    def _check_transport(self) -> Config:
        slots = self.transport.shm_slots
        backlog = self.redis.frames_maxlen  # cameras' max_backlog may not exceed it
        if slots is not None and slots <= backlog:
            message = (
                f"must be more than redis.frames_maxlen ({backlog}), or frames are "
                "overwritten before the batcher reads them"
            )
            raise fail_at(type(self).__name__, [(("transport", "shm_slots"), message, slots)])
        return self

    @model_validator(mode="after")
    def _check_cameras(self) -> Config:
        problems: list[Problem] = []
        first: dict[str, int] = {}
        for index, camera in enumerate(self.cameras):
            if camera.id in first:
                message = f"duplicate camera id {camera.id!r} (also cameras[{first[camera.id]}])"
                problems.append((("cameras", index, "id"), message, camera.id))
            first.setdefault(camera.id, index)
            if camera.max_backlog is not None and camera.max_backlog > self.redis.frames_maxlen:
                message = f"must be <= redis.frames_maxlen ({self.redis.frames_maxlen})"
                problems.append((("cameras", index, "max_backlog"), message, camera.max_backlog))
        if problems:
            raise fail_at(type(self).__name__, problems)
        return self

    def camera(self, camera_id: str) -> CameraConfig:
        """The camera with this id; KeyError names the configured ids otherwise."""
        for camera in self.cameras:
            if camera.id == camera_id:
                return camera
        known = ", ".join(c.id for c in self.cameras)
        raise KeyError(f"unknown camera id {camera_id!r} (configured: {known})")
