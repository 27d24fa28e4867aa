"""The device path shared by the torch and TensorRT backends.

A batch goes through two calls, made on two threads by the batch worker:

* ``stage`` (reader thread): copy the letterboxed uint8 frames into a pinned host slot and,
  on CUDA, start the upload on the *upload* stream and record an event;
* ``run`` (inference thread): on the *compute* stream, wait for that event, normalise on the
  device (BGR→RGB, /255, NHWC→NCHW, FP16 if asked), run the model, run NMS on the device, and
  copy only the kept boxes back to pinned host memory.

So while batch k computes, batch k+1 uploads: double buffering, with a pool of slots (pinned
host buffer + device buffer sized for the max batch, allocated once). A slot returns to the
pool only when the batch that used it has finished on the device. ``double_buffer=False``
uploads on the compute stream instead (the single-buffered baseline of the benchmark).

On the CPU the same code runs without streams, pinned memory or graphs.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detectors.base import BackendOptions
from detectors.device.nms import decode_nms
from detectors.postprocess import InputDetections

#: Slots in flight: one being filled by the reader, one waiting for the detector, one computing.
SLOTS = 3
#: Runs per batch size at warm-up: TorchScript's profiling executor optimises on the third run.
WARMUP_RUNS = 3

DeviceModel = Callable[[torch.Tensor], torch.Tensor]  # (N,3,H,W) input -> (N,4+C,A) raw


@dataclass
class _Slot:
    host: torch.Tensor  # (max_batch, H, W, 3) uint8, pinned on CUDA
    host_view: np.ndarray  # the same memory, for numpy copies
    device: torch.Tensor  # (max_batch, H, W, 3) uint8 on the model's device (the host on CPU)
    uploaded: Any  # torch.cuda.Event, None on the CPU

    def batch(self, size: int, height: int, width: int) -> tuple[np.ndarray, torch.Tensor]:
        """(host numpy, device tensor) views of the slot's first bytes as a contiguous
        (size, height, width, 3) batch: a rectangular batch (640x384) of a model that takes any
        size uses part of a slot sized for the full square."""
        count = size * height * width * 3
        shape = (size, height, width, 3)
        return (
            self.host_view.reshape(-1)[:count].reshape(shape),
            self.device.view(-1)[:count].view(shape),
        )

    def host_batch(self, size: int, height: int, width: int) -> torch.Tensor:
        count = size * height * width * 3
        return self.host.view(-1)[:count].view(size, height, width, 3)


@dataclass(frozen=True)
class StagedBatch:
    """A batch in a slot of ``owner``; on CUDA its upload may still be in flight.  Another
    runner of the same model (an instance on another thread) may run it: the slot goes back to
    its owner's pool, or that runner's reader would run out of slots and wait for ever."""

    slot: _Slot
    size: int
    height: int
    width: int
    owner: DeviceRunner

    def on_device(self) -> torch.Tensor:
        return self.slot.batch(self.size, self.height, self.width)[1]


def normalise(images: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 NHWC BGR -> contiguous NCHW RGB in [0, 1] of ``dtype``, on the images' device;
    the same float32 division as the host path (:func:`detectors.preprocess.to_network_input`)
    before any cast to FP16."""
    tensor = images.permute(0, 3, 1, 2).flip(1)
    return tensor.to(torch.float32).div_(255.0).to(dtype).contiguous()


class _GraphedForward:
    """One CUDA graph of normalise + model for a fixed batch size (static input and output).

    Captured on a stream of the model's own device (``torch.cuda.graph``'s default capture
    stream belongs to whichever device was current when it was first made), then replayed once
    and checked against the eager result: a model that keeps tensors between calls (buffers
    rebuilt per input shape) would otherwise replay stale addresses silently."""

    def __init__(
        self, forward: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor, pool: Any
    ):
        device = example.device
        self.input = example.clone()
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside capture (lazy init, autotuning)
                forward(self.input)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=side):
            self.output = forward(self.input)
        self.graph.replay()
        eager = forward(self.input)
        torch.cuda.synchronize(device)
        if not torch.allclose(self.output.float(), eager.float(), rtol=1e-3, atol=1e-3):
            raise RuntimeError(
                f"the CUDA graph of batch {len(example)} differs from the eager run: "
                "this model cannot be captured; set model.cuda_graphs: false"
            )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        self.input.copy_(images, non_blocking=True)
        self.graph.replay()
        return self.output


class DeviceRunner:
    """Stages and runs batches of a :data:`DeviceModel` on one device."""

    def __init__(
        self,
        model: DeviceModel,
        *,
        input_dtype: torch.dtype,
        height: int,
        width: int,
        options: BackendOptions,
        graphs_allowed: bool = True,
    ):
        self._model = model
        self._dtype = input_dtype
        self._options = options
        self.device = torch.device(options.device)
        self.cuda = self.device.type == "cuda"
        self.captures_graphs = options.cuda_graphs and graphs_allowed and self.cuda
        self._graphs: dict[tuple[int, int, int], _GraphedForward] = {}  # (size, H, W)
        self._height, self._width = height, width
        self._free: queue.Queue[_Slot] = queue.Queue()
        shape = (options.max_batch, height, width, 3)
        for _ in range(SLOTS):
            host = torch.empty(shape, dtype=torch.uint8, pin_memory=self.cuda)
            device = (
                torch.empty(shape, dtype=torch.uint8, device=self.device) if self.cuda else host
            )
            event = torch.cuda.Event() if self.cuda else None
            self._free.put(_Slot(host, host.numpy(), device, event))
        if self.cuda:
            self._upload_stream = torch.cuda.Stream(device=self.device)
            self._compute_stream = torch.cuda.Stream(device=self.device)
            # kept boxes come back into these (at most max_det rows per image): no allocation
            rows = options.max_batch * options.thresholds.max_det
            self._rows_host = torch.empty((rows, 6), dtype=torch.float32, pin_memory=True)
            self._counts_host = torch.empty(options.max_batch, dtype=torch.int64, pin_memory=True)

    # --- the two halves ---------------------------------------------------------------------
    def stage(self, images: Sequence[np.ndarray]) -> StagedBatch:
        """Copy ``images`` into a free slot and start their upload (blocks while none is free)."""
        size = len(images)
        if size > self._options.max_batch:
            raise ValueError(f"batch of {size} exceeds max_batch {self._options.max_batch}")
        height, width = images[0].shape[:2]
        if height > self._height or width > self._width:
            raise ValueError(
                f"{width}x{height} images exceed the model's {self._width}x{self._height}"
            )
        slot = self._free.get()
        try:
            host, device = slot.batch(size, height, width)
            for index, image in enumerate(images):
                host[index] = image
        except BaseException:  # e.g. images of two sizes: the slot was never used
            self._free.put(slot)
            raise
        if self.cuda and self._options.double_buffer:
            with torch.cuda.stream(self._upload_stream):
                device.copy_(slot.host_batch(size, height, width), non_blocking=True)
                slot.uploaded.record(self._upload_stream)
        return StagedBatch(slot, size, height, width, self)

    def run(self, staged: StagedBatch) -> np.ndarray | list[InputDetections]:
        """Run a staged batch to the end; returns NMS results (or the raw output, ``nms: host``).
        The batch may have been staged by another runner of the same device (instances share
        the reader that prepares): this runner's compute stream waits for that one's upload."""
        slot, size, owner = staged.slot, staged.size, staged.owner
        try:
            stream = torch.cuda.stream(self._compute_stream) if self.cuda else nullcontext()
            with stream, torch.inference_mode():
                images = staged.on_device()
                if self.cuda:
                    if self._options.double_buffer:
                        self._compute_stream.wait_event(slot.uploaded)
                    else:
                        host = slot.host_batch(size, staged.height, staged.width)
                        images.copy_(host, non_blocking=True)
                raw = self._forward(images)
                if self._options.nms == "host":
                    return raw.float().cpu().numpy()  # synchronises
                return self._nms_to_host(raw)
        except BaseException:
            if self.cuda:  # the device may still read the slot: wait before it is reused
                owner._upload_stream.synchronize()
                self._compute_stream.synchronize()
            raise
        finally:
            owner._free.put(slot)  # its batch has finished on the device (synchronised above)

    def _forward(self, images: torch.Tensor) -> torch.Tensor:
        graph = self._graphs.get(tuple(images.shape[:3]))  # (size, height, width)
        return graph(images) if graph is not None else self._normalised_model(images)

    def _normalised_model(self, images: torch.Tensor) -> torch.Tensor:
        return self._model(normalise(images, self._dtype))

    def _nms_to_host(self, raw: torch.Tensor) -> list[InputDetections]:
        # NMS makes the host wait where a count decides a shape: the candidates above the
        # score threshold, the per-image caps on candidates and on kept boxes (boolean masks),
        # and the NMS kernel's kept list; after it only the kept rows and the counts come back
        packed = decode_nms(raw, self._options.thresholds)
        if self.cuda:
            kept, images = len(packed.rows), len(packed.counts)
            rows, counts = self._rows_host[:kept], self._counts_host[:images]
            rows.copy_(packed.rows, non_blocking=True)
            counts.copy_(packed.counts, non_blocking=True)
            self._compute_stream.synchronize()
            rows_np = rows.numpy().copy()  # the pinned buffer is the next batch's
        else:
            rows_np, counts = packed.rows.numpy(), packed.counts
        found, start = [], 0
        for count in counts.tolist():
            chunk = rows_np[start : start + count]
            found.append(InputDetections(chunk[:, :4], chunk[:, 4], chunk[:, 5].astype(np.int64)))
            start += count
        return found

    # --- lifecycle --------------------------------------------------------------------------
    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Run each size (lazy init, autotuning, JIT); capture its CUDA graph when enabled."""
        device = torch.cuda.device(self.device) if self.cuda else nullcontext()
        pool = torch.cuda.graph_pool_handle() if self.captures_graphs else None  # shared by sizes
        with device:
            for size in batch_sizes:
                blank = [np.full((self._height, self._width, 3), 114, np.uint8)] * size
                for _ in range(WARMUP_RUNS):
                    self.run(self.stage(blank))
                key = (size, self._height, self._width)
                if self.captures_graphs and key not in self._graphs:
                    with torch.inference_mode():
                        example = torch.full((*key, 3), 114, dtype=torch.uint8, device=self.device)
                        self._graphs[key] = _GraphedForward(self._normalised_model, example, pool)
            if self.cuda:
                torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self._graphs.clear()
        self._model = None  # type: ignore[assignment]
        if self.cuda:
            torch.cuda.synchronize(self.device)
