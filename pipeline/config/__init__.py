"""The framebatch config: the pydantic models (:mod:`.schema`), YAML loading with ``${VAR}``
interpolation (:mod:`.loading`), and errors that name the dotted path (:mod:`.errors`)."""

from pipeline.config.errors import ConfigError, format_validation_errors
from pipeline.config.loading import load_config, parse_config
from pipeline.config.schema import (
    MAX_CAMERAS_PER_DAEMON,
    MODEL_SUFFIXES,
    BatchingConfig,
    CameraConfig,
    Config,
    HttpConfig,
    ModelConfig,
    RedisConfig,
    TransportConfig,
    split_listen,
)

__all__ = [
    "MAX_CAMERAS_PER_DAEMON",
    "MODEL_SUFFIXES",
    "BatchingConfig",
    "CameraConfig",
    "Config",
    "ConfigError",
    "HttpConfig",
    "ModelConfig",
    "RedisConfig",
    "TransportConfig",
    "format_validation_errors",
    "load_config",
    "parse_config",
    "split_listen",
]
