"""The device path every torch-run model shares (:class:`DeviceBackend`: pinned slots, two
CUDA streams, NMS on the device), used by the TorchScript, Ultralytics ``.pt`` and TensorRT
backends; and the device check they all make first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from detectors.base import BackendOptions, BackendUnavailable, BatchOutput, ModelInfo, parse_device
from detectors.device.runner import DeviceModel, DeviceRunner, StagedBatch


def check_device(options: BackendOptions) -> torch.device:
    """The torch device of ``options.device``; a clear error when CUDA is asked for but absent."""
    kind, index = parse_device(options.device)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                f"device {options.device!r} asked for, but torch {torch.__version__} sees no "
                "CUDA device (a CPU build, or no driver): use device: cpu"
            )
        if index >= torch.cuda.device_count():
            raise BackendUnavailable(
                f"device {options.device!r} asked for, but only "
                f"{torch.cuda.device_count()} CUDA device(s) are visible"
            )
        return torch.device("cuda", index)
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    return torch.device("cpu")


class DeviceBackend:
    """A model run through :class:`DeviceRunner`: pinned slots, two streams, NMS on the device."""

    name = "torch"

    def __init__(
        self,
        info: ModelInfo,
        model: DeviceModel,
        *,
        input_dtype: torch.dtype,
        options: BackendOptions,
        graphs_allowed: bool = True,
    ):
        max_batch = min(options.max_batch, info.max_batch or options.max_batch)
        self._runner = DeviceRunner(
            model,
            input_dtype=input_dtype,
            height=info.input_height,
            width=info.input_width,
            options=replace(options, max_batch=max_batch),
            graphs_allowed=graphs_allowed,
        )
        self.info = replace(info, warms_alone=self._runner.captures_graphs)

    def prepare(self, images: Sequence[np.ndarray]) -> StagedBatch:
        return self._runner.stage(images)

    def infer(self, prepared: StagedBatch) -> BatchOutput:
        result = self._runner.run(prepared)
        if isinstance(result, np.ndarray):  # nms: host
            return BatchOutput(raw=result)
        return BatchOutput(found=tuple(result))

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        self._runner.warmup(batch_sizes)

    def close(self) -> None:
        self._runner.close()
