"""``framebatch export``: an Ultralytics ``.pt`` to ONNX, TorchScript or a TensorRT engine.

The conversion is framebatch's own (``torch.onnx.export`` / ``torch.jit.trace`` of the raw
``(N, 4 + classes, anchors)`` head), so the files carry exactly what framebatch's backends
read, in Ultralytics' own metadata layout (ONNX ``metadata_props``, TorchScript ``config.txt``,
the engine's JSON header), so each side can load the other's files. Ultralytics (AGPL-3.0,
the optional extra) is needed only to unpickle the ``.pt``; an engine can also be built from
an ``.onnx`` without it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any, Literal

from detectors.metadata import class_names
from detectors.preprocess import Letterbox

log = logging.getLogger(__name__)

ExportFormat = Literal["onnx", "torchscript", "engine"]  # the keys of EXPORT_FORMATS
ONNX_OPSET = 17  # what TensorRT 10 and onnxruntime >= 1.14 both read


@dataclass(frozen=True)
class ExportRequest:
    """One export: source model, target format and the engine's batch profile."""

    source: Path  # .pt (any format) or .onnx (engine only)
    format: ExportFormat
    output: Path | None = None  # default: the source with the format's suffix
    imgsz: int = 640
    max_batch: int = 32
    opt_batch: int = 8  # the engine profile's optimum: the batcher's preferred size
    rect: bool = True  # an engine's profile also spans heights and widths (model.rect)
    half: bool = False
    int8: bool = False
    calib_clips: tuple[Path, ...] = ()
    calib_frames: int = 256
    device: str = "cpu"
    workspace_gib: float = 4.0
    extra_metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> Path:
        return self.output or self.source.with_suffix(EXPORT_FORMATS[self.format].suffix)

    def check(self) -> None:
        """Argument errors, before anything heavy is loaded."""
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r} (expected {', '.join(FORMATS)})")
        if self.source.suffix.lower() not in EXPORT_FORMATS[self.format].sources:
            raise ValueError(
                f"cannot export {self.source.name} to {self.format}: the source must be a .pt "
                "(or an .onnx with a dynamic batch axis for --format engine)"
            )
        if not 1 <= self.opt_batch <= self.max_batch:
            raise ValueError(f"--opt-batch {self.opt_batch} must be within 1..{self.max_batch}")
        if self.imgsz % 32:
            raise ValueError(f"--imgsz {self.imgsz} must be a multiple of 32")
        if self.int8 and self.format != "engine":
            raise ValueError("--int8 is for --format engine only")
        if self.int8 and not self.calib_clips:
            raise ValueError("--int8 needs --calib-clips: real frames to calibrate on")
        if self.half and self.format != "engine" and not self.device.startswith("cuda"):
            raise ValueError("--half exports need --device cuda (FP16 is for GPUs)")


def metadata(request: ExportRequest, names: tuple[str, ...], stride: int) -> dict[str, Any]:
    """Model facts in Ultralytics' layout (``names`` as ``{class id: name}``), plus the batch
    profile framebatch reads."""
    try:
        version = package_metadata.version("framebatch")
    except package_metadata.PackageNotFoundError:  # running from a source tree
        version = "0"
    return {
        "description": "YOLOv8 exported by framebatch",
        "author": "framebatch",
        "date": datetime.now(UTC).isoformat(),
        "version": version,
        "license": "AGPL-3.0 (Ultralytics weights)",
        "stride": stride,
        "task": "detect",
        "batch": request.max_batch,
        "imgsz": [request.imgsz, request.imgsz],
        "names": dict(enumerate(names)),
        "dynamic": True,
        "half": request.half,
        "int8": request.int8,
        "min_batch": 1,
        "opt_batch": request.opt_batch,
        "max_batch": request.max_batch,
        **request.extra_metadata,
    }


def export(request: ExportRequest) -> Path:
    """Write the exported model; returns its path."""
    request.check()
    request.target.parent.mkdir(parents=True, exist_ok=True)
    return EXPORT_FORMATS[request.format].write(request)


def _load_for_export(request: ExportRequest) -> tuple[Any, Any, dict[str, Any]]:
    """The checkpoint's raw-output model in export mode, an example input and its facts."""
    import torch

    from detectors.base import BackendOptions
    from detectors.device.backend import check_device
    from detectors.device.checkpoint import RawOutput, load_checkpoint

    device = check_device(BackendOptions(device=request.device))
    model, facts = load_checkpoint(request.source, device)
    for module in model.modules():  # Ultralytics' export switches on its Detect head
        if hasattr(module, "export") and hasattr(module, "dynamic"):
            module.export, module.dynamic, module.format = True, True, "onnx"
    dtype = torch.float16 if request.half else torch.float32
    model = model.to(dtype)
    example = torch.zeros(1, 3, request.imgsz, request.imgsz, dtype=dtype, device=device)
    names = class_names(facts["names"])
    return RawOutput(model).eval(), example, metadata(request, names, facts["stride"])


def _export_onnx(request: ExportRequest) -> Path:
    import onnx
    import torch

    model, example, facts = _load_for_export(request)
    target = request.target
    torch.onnx.export(
        model,
        (example,),
        str(target),
        input_names=["images"],
        output_names=["output0"],
        # batch, height and width dynamic: rectangular inference (model.rect) and any batch
        dynamic_axes={
            "images": {0: "batch", 2: "height", 3: "width"},
            "output0": {0: "batch", 2: "anchors"},
        },
        opset_version=ONNX_OPSET,
        dynamo=False,  # the TorchScript-based exporter: plain opset-17 graphs TensorRT parses
        do_constant_folding=True,
    )
    proto = onnx.load(str(target))
    for key, value in facts.items():  # Ultralytics stores Python literals as strings
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.save(proto, str(target))
    return target


def _export_torchscript(request: ExportRequest) -> Path:
    import torch

    model, example, facts = _load_for_export(request)
    with torch.no_grad(), _anchors_on_the_input_device():
        traced = torch.jit.trace(model, example, strict=False, check_trace=False)
    traced.save(str(request.target), _extra_files={"config.txt": json.dumps(facts)})
    return request.target


@contextmanager
def _anchors_on_the_input_device() -> Iterator[None]:
    """While tracing, the Detect head makes its anchor grid on the input's device.

    A trace records every ``device=`` as a constant.  Ultralytics 8.3's ``make_anchors`` makes
    the grid with ``device=`` the feature map's, so a file traced on the CPU fails on CUDA
    ("Expected all tensors to be on the same device"); 8.4 makes it on the CPU and moves it
    with ``type_as``.  The head's reference is swapped for :func:`_anchor_grid`, which does the
    same as 8.4 whatever version is installed."""
    from ultralytics.nn.modules import head

    original = head.make_anchors
    head.make_anchors = _anchor_grid
    try:
        yield
    finally:
        head.make_anchors = original


def _anchor_grid(feats: Any, strides: Any, grid_cell_offset: float = 0.5) -> tuple[Any, Any]:
    """Each feature map's cell centres ``(A, 2)`` and their strides ``(A, 1)``, made where the
    feature maps are by operations a trace records against them (``type_as``, ``new_full``)."""
    import torch

    points, stride_rows = [], []
    for level, feat in enumerate(feats):
        height, width = feat.shape[2:]
        xs = torch.arange(width).type_as(feat) + grid_cell_offset
        ys = torch.arange(height).type_as(feat) + grid_cell_offset
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).view(-1, 2))
        stride_rows.append(feat.new_full((height * width, 1), float(strides[level])))
    return torch.cat(points), torch.cat(stride_rows)


def _export_engine(request: ExportRequest) -> Path:
    from detectors.tensorrt.build import build_engine, int8_accuracy_report, letterboxed_frames
    from detectors.tensorrt.engine import import_tensorrt

    import_tensorrt()  # before the ONNX step: fail fast where TensorRT is missing
    onnx_path = request.source
    if request.source.suffix.lower() == ".pt":
        onnx_path = request.target.with_suffix(".onnx")
        export(replace(request, format="onnx", output=onnx_path, half=False))
    names, stride = _onnx_facts(onnx_path)
    facts = metadata(request, names, stride)
    calibration = None
    if request.int8:
        per_clip = max(1, request.calib_frames // len(request.calib_clips))
        letterbox = Letterbox(request.imgsz, request.imgsz)
        frames = letterboxed_frames(request.calib_clips, letterbox, frames_per_clip=per_clip)
        calibration = [boxed.pixels for boxed in frames]
    cache_dir = request.target.parent
    build = dict(
        imgsz=request.imgsz,
        rect=request.rect,
        min_batch=1,
        opt_batch=request.opt_batch,
        max_batch=request.max_batch,
        timing_cache=cache_dir / "framebatch.timing-cache",
        workspace_gib=request.workspace_gib,
    )
    engine = build_engine(
        onnx_path,
        request.target,
        half=request.half or request.int8,
        int8=request.int8,
        calibration_images=calibration,
        calibration_cache=request.target.with_suffix(".calib-cache") if request.int8 else None,
        metadata=facts,
        **build,
    )
    if request.int8:  # an INT8 engine is checked against FP16 on the same clips
        fp16 = request.target.with_name(request.target.stem + "-fp16.engine")
        build_engine(
            onnx_path,
            fp16,
            half=True,
            int8=False,
            calibration_images=None,
            calibration_cache=None,
            metadata={**facts, "int8": False, "half": True},
            **build,
        )
        report = int8_accuracy_report(engine, fp16, request.calib_clips)
        report_path = request.target.with_suffix(".int8-report.md")
        report_path.write_text(report.to_markdown(), encoding="utf-8")
        log.info("INT8 vs FP16 accuracy: %s", report_path)
    return engine


def _onnx_facts(path: Path) -> tuple[tuple[str, ...], int]:
    import onnx

    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    try:
        names = class_names(props.get("names"))
    except ValueError as exc:  # the engine still builds; its reader numbers the classes
        log.warning("%s: class names left out of the engine: %s", path.name, exc)
        names = ()
    return names, int(props.get("stride", 32))


@dataclass(frozen=True)
class Exporter:
    """One export format: the suffix of the file it writes, the source suffixes it converts
    from, and the function that writes it."""

    suffix: str
    sources: tuple[str, ...]
    write: Callable[[ExportRequest], Path]


EXPORT_FORMATS: dict[str, Exporter] = {
    "onnx": Exporter(".onnx", (".pt",), _export_onnx),
    "torchscript": Exporter(".torchscript", (".pt",), _export_torchscript),
    "engine": Exporter(".engine", (".pt", ".onnx"), _export_engine),
}
FORMATS: tuple[str, ...] = tuple(EXPORT_FORMATS)  # the CLI's ``--format`` choices
