"""The backend protocol every detector backend implements, and the model facts it reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class BackendUnavailable(RuntimeError):
    """An optional library a backend needs is not installed; the message names the extra."""


@dataclass(frozen=True)
class ModelInfo:
    """What the pipeline needs to know about a loaded model."""

    path: str
    backend: str
    input_width: int
    input_height: int
    class_names: tuple[str, ...]
    min_batch: int = 1
    max_batch: int | None = None  # None: no upper bound declared by the model

    def label(self, class_id: int) -> str:
        names = self.class_names
        return names[class_id] if 0 <= class_id < len(names) else str(class_id)


class Backend(Protocol):
    """A loaded model that runs a whole batch in one call.

    ``prepare`` turns a uint8 NHWC BGR batch into the backend's input (normalisation, layout,
    upload); it is split from ``infer`` so the next batch can be prepared while this one runs.
    ``infer`` returns the raw YOLOv8 output ``(N, 4 + classes, anchors)`` as float32 on the host.
    A backend instance belongs to one thread.
    """

    info: ModelInfo

    def prepare(self, images: Any) -> Any: ...

    def infer(self, prepared: Any) -> Any: ...

    def warmup(self, batch_sizes: Sequence[int]) -> None: ...

    def close(self) -> None: ...
