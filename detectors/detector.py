"""A detector: backend + shared batched pre/post-processing, in three stages that can overlap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detectors.base import Backend, ModelInfo
from detectors.postprocess import ImageDetections, InputDetections, Thresholds, postprocess
from detectors.preprocess import Letterbox, LetterboxGeometry


class Detector:
    """Runs batches of letterboxed frames through a backend.

    ``prepare`` → ``infer`` → ``postprocess`` are separate so a pipeline can prepare the next
    batch and post-process the last one while the backend is busy.
    """

    def __init__(self, backend: Backend, *, thresholds: Thresholds):
        self.backend = backend
        self.thresholds = thresholds

    @property
    def info(self) -> ModelInfo:
        return self.backend.info

    def letterbox(self, *, rect: bool = False) -> Letterbox:
        """The letterbox that produces this model's input (``rect``: the minimum rectangle,
        for a model that takes any size)."""
        return Letterbox(width=self.info.input_width, height=self.info.input_height, rect=rect)

    def prepare(self, images: Sequence[np.ndarray]) -> Any:
        return self.backend.prepare(images)

    def infer(self, prepared: Any) -> np.ndarray | list[InputDetections]:
        return self.backend.infer(prepared)

    def postprocess(
        self, raw: np.ndarray | list[InputDetections], geometries: Sequence[LetterboxGeometry]
    ) -> list[ImageDetections]:
        """Raw output: decode + NMS here; a device backend's NMS results: only un-letterbox."""
        if isinstance(raw, np.ndarray):
            return postprocess(raw, geometries, self.thresholds)
        return [found.to_original(g) for found, g in zip(raw, geometries, strict=True)]

    def detect(
        self, images: Sequence[np.ndarray], geometries: Sequence[LetterboxGeometry]
    ) -> list[ImageDetections]:
        """All three stages for one batch of letterboxed images."""
        return self.postprocess(self.infer(self.prepare(images)), geometries)

    def detect_frames(
        self, frames: Sequence[np.ndarray], *, rect: bool = False
    ) -> list[ImageDetections]:
        """Detect on original BGR frames (letterbox here): the reference, frame-by-frame path."""
        letterbox = self.letterbox(rect=rect)
        boxed = [letterbox(frame) for frame in frames]
        return self.detect([b.pixels for b in boxed], [b.geometry for b in boxed])

    def close(self) -> None:
        self.backend.close()
