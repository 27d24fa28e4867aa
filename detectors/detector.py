"""A detector: backend + shared batched pre/post-processing, in three stages that can overlap."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from detectors.base import Backend, BatchOutput, ModelInfo
from detectors.postprocess import ImageDetections, Thresholds, postprocess
from detectors.preprocess import PAD_VALUE, Letterbox, LetterboxGeometry


class Detector:
    """Runs batches of letterboxed frames through a backend.

    ``prepare`` → ``infer`` → ``postprocess`` are separate so a pipeline can prepare the next
    batch and post-process the last one while the backend is busy.

    ``instances``: further loads of the same model (Triton's instance group), each run by a
    thread of its own with ``infer(..., instance=k)``, so batches run side by side; on a CPU
    two one-thread ONNX Runtime sessions outrun one two-thread session (docs/benchmarks.md).
    """

    def __init__(
        self, backend: Backend, *, thresholds: Thresholds, instances: Sequence[Backend] = ()
    ):
        self.backend = backend
        self.thresholds = thresholds
        self._backends = (backend, *instances)

    @property
    def instances(self) -> int:
        """How many batches can run at once (one per loaded instance of the model)."""
        return len(self._backends)

    @property
    def info(self) -> ModelInfo:
        return self.backend.info

    def letterbox(self, *, rect: bool = False) -> Letterbox:
        """The letterbox that produces this model's input (``rect``: the minimum rectangle,
        for a model that takes any size)."""
        return Letterbox(width=self.info.input_width, height=self.info.input_height, rect=rect)

    def prepare(self, images: Sequence[np.ndarray]) -> Any:
        return self.backend.prepare(images)

    def infer(self, prepared: Any, instance: int = 0) -> BatchOutput:
        """Run a prepared batch on one instance (each instance on one thread at a time)."""
        return self._backends[instance].infer(prepared)

    def postprocess(
        self, output: BatchOutput, geometries: Sequence[LetterboxGeometry]
    ) -> list[ImageDetections]:
        """Raw output: decode + NMS here; a device backend's NMS results: only un-letterbox."""
        if output.raw is not None:
            return postprocess(output.raw, geometries, self.thresholds)
        found = output.found or ()
        return [boxes.to_original(g) for boxes, g in zip(found, geometries, strict=True)]

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

    def warmup(self, batch_sizes: Sequence[int], shape: tuple[int, int] | None = None) -> None:
        """Run each batch size once on every instance (only the smallest where one run warms
        every size), the instances side by side; ``shape``: the (height, width) the pipeline
        will run when not the model's own input (rect)."""
        if not self.info.warms_per_size:
            batch_sizes = sorted(batch_sizes)[:1]

        def warm(instance: int) -> None:
            backend = self._backends[instance]
            if shape is None or shape == (self.info.input_height, self.info.input_width):
                backend.warmup(batch_sizes)
                return
            blank = np.full((*shape, 3), PAD_VALUE, np.uint8)
            for size in batch_sizes:
                backend.infer(backend.prepare([blank] * size))

        self._on_every_instance(warm)

    def time_batches(
        self, batch_sizes: Sequence[int], shape: tuple[int, int]
    ) -> list[tuple[int, float]]:
        """(size, seconds) of one inference of each size on every instance, the instances side
        by side as the pipeline runs them (two one-thread sessions share the caches and the
        memory bus: alone, each runs faster than it will)."""
        samples: list[tuple[int, float]] = []
        blank = np.full((*shape, 3), PAD_VALUE, np.uint8)

        def timed(instance: int) -> None:
            backend = self._backends[instance]
            for size in batch_sizes:
                prepared = backend.prepare([blank] * size)
                started = time.perf_counter()
                backend.infer(prepared)
                samples.append((size, time.perf_counter() - started))  # append: atomic

        self._on_every_instance(timed)
        return samples

    def _on_every_instance(self, work: Callable[[int], None]) -> None:
        """``work`` for each instance, side by side; one after another where an instance's
        warm-up captures CUDA graphs, which another thread's device work would break."""
        alone = any(backend.info.warms_alone for backend in self._backends)
        with ThreadPoolExecutor(
            1 if alone else self.instances, thread_name_prefix="fb-warmup"
        ) as pool:
            list(pool.map(work, range(self.instances)))  # list(): re-raises a failure

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
