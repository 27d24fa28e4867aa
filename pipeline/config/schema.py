"""The framebatch config's pydantic models: every setting, its bounds and its description.

Declared once, validated once. Every error is a line ``dotted.path: message`` and no message
ever shows a password from a URL. Validators do no I/O: relative paths are joined to the
config file's folder (passed as validation context ``base_dir``) but never checked on disk.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from detectors.backends import backend_names, suffixes
from detectors.catalog import KNOWN_MODELS, known_name, model_path
from pipeline.config.analytics import SnapshotStoreConfig
from pipeline.config.batching import BatchingConfig
from pipeline.config.cameras import CameraConfig
from pipeline.config.errors import Problem, clip, fail, fail_at
from pipeline.config.fields import MODEL_CONFIG, Finite, key_part, resolve_path
from pipeline.config.outputs import Outputs
from streams.redis_connect import DEFAULT_RECONNECT_TIMEOUT_S
from streams.sinks import DEFAULT_SINK, default_sinks, sink_options_models

#: Model file suffix -> backend name used by ``backend: auto`` (the detectors' own map).
MODEL_SUFFIXES: dict[str, str] = suffixes()
#: ``model.backend``: auto, or a module of ``detectors/backends`` (a new module is a new choice)
BackendName = Literal[("auto", *backend_names())]  # type: ignore[valid-type]
_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")

#: Past this, split the cameras across daemons (docs/operations.md, "Many cameras").
MAX_CAMERAS_PER_DAEMON = 256
DEFAULT_CAMERAS_PER_PROCESS = 8
ClassIds = Annotated[list[Annotated[int, Field(ge=0, le=999)]], Field(min_length=1)]
#: A ``sinks:`` entry: the options of the sink its ``kind`` names (one module each).
SinkSettings = Annotated[Union[sink_options_models()], Field(discriminator="kind")]  # noqa: UP007


class RedisConfig(BaseModel):
    """Where frames and detections live."""

    model_config = MODEL_CONFIG
    url: str | None = Field(None, description="redis:// URL; unset: start a private redis-server")
    prefix: str = Field("fb", description="Key prefix: <prefix>:frames:{<camera>}, ...")
    frames_maxlen: int = Field(64, ge=2, description="MAXLEN ~ of each frames stream")
    detections_maxlen: int = Field(100_000, ge=1, description="MAXLEN ~ of each detections stream")
    events_maxlen: int = Field(
        100_000, ge=1, description="MAXLEN ~ of each camera's analytics events stream"
    )
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
        return key_part(prefix, "key prefix", 64)

    @model_validator(mode="after")
    def _cluster_needs_url(self) -> RedisConfig:
        if self.cluster and not self.url:
            raise fail("cluster: true needs url: a node of the Redis Cluster to use")
        return self


class ModelConfig(BaseModel):
    """The detector model and its post-processing."""

    model_config = MODEL_CONFIG
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
        return resolve_path(path, info)

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


class TransportConfig(BaseModel):
    """How frame pixels travel from the decoders to the batcher (see docs/transports.md)."""

    model_config = MODEL_CONFIG
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


class DecodingConfig(BaseModel):
    """How the decoders run (see docs/operations.md, "Many cameras")."""

    model_config = MODEL_CONFIG
    cameras_per_process: int = Field(
        DEFAULT_CAMERAS_PER_PROCESS,
        ge=1,
        le=256,
        description="Cameras decoded by one process, a thread each; a process's crash takes "
        "its cameras (restarted with new sessions); fewer processes start faster and use "
        "less memory",
    )
    worker_capacity: Finite | None = Field(
        None,
        gt=0,
        description="framebatch decode: the most camera weight (decode_weight) one decode "
        "worker takes; unset: no limit.  What no worker has room for is reported unplaced "
        "(framebatch_decode_unplaced_cameras, /api/decoders), not decoded",
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

    model_config = MODEL_CONFIG
    listen: str | None = Field(
        DEFAULT_HTTP_LISTEN,
        description="host:port to serve /metrics, /healthz, /readyz, /api and the live view "
        "on (port 0: any free one); off (as --http off; YAML's bare off, a boolean, too) or "
        "null: no HTTP endpoint",
    )
    token: str | None = Field(
        None,
        min_length=16,
        description="Bearer token the API and the view require (use ${VAR}); required when "
        "listen is not a loopback address. /metrics and the probes stay open",
    )

    @field_validator("listen", mode="before")
    @classmethod
    def _off_is_none(cls, listen: object) -> object:
        """``off`` (``--http off``, a quoted 'off') and YAML 1.1's bare ``off`` (the boolean
        false) both mean no endpoint, as null does."""
        if listen is False or listen == "off":
            return None
        if listen is True:  # bare on/yes/true
            raise fail("expected host:port, off or null, got true (on/yes: a YAML boolean)")
        return listen

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, listen: str | None) -> str | None:
        if listen is None:
            return None
        try:
            split_listen(listen)
        except ValueError as exc:
            raise fail(f"{clip(str(exc))}; off: no HTTP endpoint") from None
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

    model_config = MODEL_CONFIG
    redis: RedisConfig = Field(default_factory=RedisConfig, description="Redis and its bounds")
    model: ModelConfig = Field(description="Detector model")
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="Batching policy")
    cameras: list[CameraConfig] = Field(
        min_length=1,
        max_length=MAX_CAMERAS_PER_DAEMON,
        description="Video sources, unique ids",
    )
    decoding: DecodingConfig = Field(
        default_factory=DecodingConfig, description="How the decoders run"
    )
    transport: TransportConfig = Field(
        default_factory=TransportConfig, description="How frames travel to the batcher"
    )
    http: HttpConfig = Field(
        default_factory=HttpConfig, description="Metrics, health, camera API and live view"
    )
    snapshots: SnapshotStoreConfig = Field(
        default={},  # validated, so that the default path too joins the config's folder
        validate_default=True,
        description="Where event snapshots go (cameras with analytics.snapshots)",
    )
    sinks: list[SinkSettings] = Field(
        default_factory=default_sinks,
        min_length=1,
        max_length=8,
        description="Where detections go, each written before a frame is acknowledged "
        "(kinds: one per module in streams/sinks/); default: redis_streams",
    )
    outputs: Outputs = Field(default_factory=list)

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
