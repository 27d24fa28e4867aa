"""The ``batching`` section: the shared settings, and the chosen policy's own beside them."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
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

from pipeline.batching.policies import (
    DEFAULT_POLICY,
    PolicyOptions,
    policy_names,
    policy_options_models,
    policy_settings,
)
from pipeline.config.errors import clip, fail
from pipeline.config.fields import MODEL_CONFIG, Finite


class BatchingConfig(BaseModel):
    """How frames of all cameras are grouped into one inference batch.

    The chosen policy's own settings (its module's ``Options`` in
    ``pipeline/batching/policies/``) are written beside ``policy``, as in
    ``{policy: aimd, latency_target_ms: 300}``, and read as :attr:`policy_options`.
    """

    model_config = MODEL_CONFIG
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
