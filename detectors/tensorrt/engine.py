"""A deserialized TensorRT engine that runs one batch of torch CUDA tensors on the caller's stream.

TensorRT 10 name-based API only (``num_io_tensors``, ``set_input_shape``,
``set_tensor_address``, ``execute_async_v3``). ``tensorrt`` and ``torch`` are imported when an
engine is opened, never at import time.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from detectors.base import BackendUnavailable
from detectors.tensorrt.engine_file import EngineFile, read_engine_file

if TYPE_CHECKING:
    import torch

TENSOR_ALIGNMENT = 256  # bytes; setTensorAddress requires it of every I/O address

INSTALL_HINT = (
    "install it with `pip install tensorrt` (the wheel must match your CUDA major version, "
    "e.g. tensorrt-cu12) or run in NVIDIA's container (nvcr.io/nvidia/tensorrt or "
    "nvcr.io/nvidia/pytorch); .onnx and .torchscript models run without it"
)


#: Output buffers kept per engine, one per input shape seen (oldest dropped first).
MAX_OUTPUT_BUFFERS = 64


def import_tensorrt() -> ModuleType:
    """``tensorrt``, or :class:`BackendUnavailable` saying how to get it."""
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable(f"TensorRT is not installed: {INSTALL_HINT}") from exc
    if tensorrt_major(tensorrt) < 10:  # 8.x lacks the name-based tensor API used here
        raise BackendUnavailable(
            f"TensorRT {tensorrt.__version__} is installed; framebatch needs TensorRT 10 or newer"
        )
    return tensorrt


def tensorrt_major(tensorrt: ModuleType) -> int:
    return int(str(tensorrt.__version__).split(".", 1)[0])


def import_torch_cuda() -> ModuleType:
    """``torch`` with a usable CUDA device, or :class:`BackendUnavailable`."""
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable(
            "the TensorRT backend runs on torch CUDA tensors: pip install torch (a CUDA build)"
        ) from exc
    if not torch.cuda.is_available():
        raise BackendUnavailable(
            "TensorRT needs an NVIDIA GPU and a CUDA build of torch; torch.cuda.is_available() "
            "is False here (.onnx models run on the CPU)"
        )
    return torch


def torch_dtype(trt: ModuleType, trt_dtype: Any) -> torch.dtype:
    """The torch dtype of a TensorRT tensor type, via ``trt.nptype``."""
    import numpy as np
    import torch

    try:
        numpy_dtype = np.dtype(trt.nptype(trt_dtype))
    except TypeError:
        raise ValueError(f"unsupported TensorRT tensor type {trt_dtype}") from None
    return torch.from_numpy(np.empty(0, numpy_dtype)).dtype


class TensorRTEngine:
    """One engine and one execution context on one CUDA device; belongs to one thread.

    Attributes: ``input_dtype``/``output_dtype`` (torch dtypes), ``min_batch``, ``opt_batch``,
    ``max_batch`` (optimisation profile 0), ``imgsz`` ``(height, width)``, ``class_names``,
    ``file`` (the :class:`EngineFile`: header / sidecar metadata), ``any_size`` (the profile
    spans heights and widths: rectangular batches up to ``imgsz``).
    """

    def __init__(self, path: Path, *, device: int | str = 0, verbose: bool = False):
        trt = import_tensorrt()
        torch = import_torch_cuda()
        self.path = Path(path)
        self.device = (
            torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        )
        if self.device.type != "cuda":
            raise ValueError(f"TensorRT engines run on a CUDA device, not {self.device}")
        self.file: EngineFile = read_engine_file(self.path)
        # The logger and runtime must outlive the engine: keep references to all three.
        self._logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
        with torch.cuda.device(self.device):
            self._runtime = trt.Runtime(self._logger)
            self._engine = self._runtime.deserialize_cuda_engine(self.file.read_engine())
            if self._engine is None:
                raise RuntimeError(
                    f"{self.path}: TensorRT {trt.__version__} could not deserialize this engine. "
                    "Engines load only with the TensorRT version and GPU model that built them; "
                    "rebuild it from the ONNX model on this machine (see the log above)"
                )
            self._context = self._engine.create_execution_context()
        if self._context is None:
            raise RuntimeError(f"{self.path}: could not create an execution context (GPU memory?)")
        self.input_name, self.output_name = self._io_names(trt)
        self.input_dtype = torch_dtype(trt, self._engine.get_tensor_dtype(self.input_name))
        self.output_dtype = torch_dtype(trt, self._engine.get_tensor_dtype(self.output_name))
        if self.input_dtype not in (torch.float16, torch.float32):
            raise ValueError(f"{self.path}: input {self.input_dtype} is neither FP16 nor FP32")
        self.min_batch, self.opt_batch, self.max_batch, self.imgsz = self._profile()
        self.any_size = self._sides[0] != self._sides[1]
        self.class_names = self.file.class_names or self._numbered_classes()
        # input shape -> output buffer (stable address); the anchors follow the height and width
        self._outputs: dict[tuple[int, ...], torch.Tensor] = {}
        self._bound_shape: tuple[int, ...] | None = None

    def _io_names(self, trt: ModuleType) -> tuple[str, str]:
        engine = self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(inputs) != 1 or len(outputs) != 1:
            raise ValueError(
                f"{self.path}: expected a YOLOv8 detection engine with one input and one output, "
                f"found inputs {inputs} and outputs {outputs}"
            )
        return inputs[0], outputs[0]

    def _profile(self) -> tuple[int, int, int, tuple[int, int]]:
        """Batch range and input size from optimisation profile 0 (the engine is the authority)."""
        shape = tuple(self._engine.get_tensor_shape(self.input_name))
        if len(shape) != 4:
            raise ValueError(f"{self.path}: input {self.input_name} is {shape}, not NCHW")
        if all(d > 0 for d in shape):  # fully static engine
            self._sides = ((shape[2], shape[3]), (shape[2], shape[3]))
            return shape[0], shape[0], shape[0], (shape[2], shape[3])
        low, opt, high = (
            tuple(dims) for dims in self._engine.get_tensor_profile_shape(self.input_name, 0)
        )
        self._sides = ((low[2], low[3]), (high[2], high[3]))  # (min, max) height and width
        imgsz = (opt[2], opt[3])
        wanted = self.file.imgsz  # a dynamic-size engine: use the size the metadata names
        if wanted and low[2] <= wanted[0] <= high[2] and low[3] <= wanted[1] <= high[3]:
            imgsz = wanted
        return low[0], opt[0], high[0], imgsz

    def _numbered_classes(self) -> tuple[str, ...]:
        rows = tuple(self._engine.get_tensor_shape(self.output_name))[1]
        return tuple(str(i) for i in range(rows - 4)) if rows > 4 else ()

    def _output_for(self, shape: tuple[int, ...]) -> torch.Tensor:
        import torch

        output = self._outputs.get(shape)
        if output is None:
            if len(self._outputs) >= MAX_OUTPUT_BUFFERS:
                # rect engines see batch sizes x rectangles: keep the newest shapes (a buffer
                # still held by a caller lives on until it lets go)
                del self._outputs[next(iter(self._outputs))]
            output_shape = tuple(self._context.get_tensor_shape(self.output_name))
            if any(d < 0 for d in output_shape):
                raise RuntimeError(
                    f"{self.path}: output shape {output_shape} unresolved after input shape"
                )
            output = torch.empty(output_shape, dtype=self.output_dtype, device=self.device)
            self._outputs[shape] = output
        return output

    def _check(self, images: torch.Tensor) -> None:
        (min_h, min_w), (max_h, max_w) = self._sides
        height, width = images.shape[2:] if images.dim() == 4 else (0, 0)
        if (
            images.dim() != 4
            or images.shape[1] != 3
            or not (min_h <= height <= max_h and min_w <= width <= max_w)
        ):
            sides = f"{max_h}, {max_w}"
            if self.any_size:
                sides = f"{min_h}..{max_h}, {min_w}..{max_w}"
            raise ValueError(
                f"{self.path}: expected images (N, 3, {sides}), got {tuple(images.shape)}"
            )
        batch = images.shape[0]
        if not self.min_batch <= batch <= self.max_batch:
            raise ValueError(
                f"{self.path}: batch of {batch} is outside the engine's optimisation profile "
                f"({self.min_batch}..{self.max_batch}); split the batch or rebuild the engine "
                f"with max_batch >= {batch}"
            )
        if images.dtype != self.input_dtype:
            raise TypeError(f"{self.path}: engine input is {self.input_dtype}, got {images.dtype}")
        if images.device != self.device:
            raise ValueError(
                f"{self.path}: engine runs on {self.device}, images are on {images.device}"
            )
        if not images.is_contiguous():
            raise ValueError(f"{self.path}: images must be contiguous (call .contiguous())")
        if images.data_ptr() % TENSOR_ALIGNMENT:
            # A slice of a larger batch starts mid-allocation; TensorRT wants aligned addresses.
            raise ValueError(
                f"{self.path}: images must start on a {TENSOR_ALIGNMENT}-byte boundary "
                "(pass a tensor of its own, e.g. .clone(), not an offset slice)"
            )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Enqueue one batch on the current CUDA stream; returns the ``(N, 4+C, A)`` output.

        Nothing is synchronised: read the result on the same stream (or after synchronising).
        The output is this engine's buffer for this input shape, overwritten by the next call
        with the same shape, so consume it (e.g. copy it to pinned host memory) before that call.
        """
        import torch

        if self._context is None:
            raise RuntimeError(f"{self.path}: engine is closed")
        self._check(images)
        shape = tuple(images.shape)
        context = self._context
        if shape != self._bound_shape:
            if not context.set_input_shape(self.input_name, shape):
                raise RuntimeError(f"{self.path}: TensorRT rejected input shape {shape}")
            self._bound_shape = shape
        output = self._output_for(shape)
        if not (
            context.set_tensor_address(self.input_name, images.data_ptr())
            and context.set_tensor_address(self.output_name, output.data_ptr())
        ):
            raise RuntimeError(f"{self.path}: TensorRT rejected a tensor address")
        stream = torch.cuda.current_stream(self.device)
        # TensorRT enqueues in the current device's context: a caller on another device (the
        # INT8 accuracy report on cuda:1, say) would otherwise run it on the wrong one
        with torch.cuda.device(self.device):
            if not context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError(f"{self.path}: execute_async_v3 failed (see the TensorRT log)")
        return output

    def close(self) -> None:
        """Release the context, the engine and the output buffers (legal more than once)."""
        self._outputs.clear()
        self._bound_shape = None
        self._context = None
        self._engine = None
        self._runtime = None
