"""``framebatch export``: a .pt to ONNX, TorchScript or a TensorRT engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK

#: libraries an export may need that the core install lacks -> the extra that installs them
OPTIONAL_LIBRARIES = {
    "torch": "ultralytics",
    "torchvision": "ultralytics",
    "ultralytics": "ultralytics",
    "onnx": "ultralytics",
    "tensorrt": "tensorrt",
}


def register(commands: Any) -> None:
    from detectors.export import EXPORT_FORMATS

    export = commands.add_parser(
        "export", help="export a .pt to ONNX, TorchScript or a TensorRT engine"
    )
    export.add_argument(
        "model", metavar="MODEL", help="Ultralytics .pt (or an .onnx for --format engine)"
    )
    export.add_argument(
        "--format", choices=list(EXPORT_FORMATS), required=True, help="what to write"
    )
    export.add_argument("--output", metavar="PATH", help="default: the model with the new suffix")
    export.add_argument(
        "--imgsz", type=int, default=640, metavar="N", help="input size (default: %(default)s)"
    )
    export.add_argument(
        "--max-batch",
        type=int,
        default=32,
        metavar="N",
        help="engine profile max (default: %(default)s)",
    )
    export.add_argument(
        "--opt-batch",
        type=int,
        default=8,
        metavar="N",
        help="engine profile optimum: the batcher's preferred size (default: %(default)s)",
    )
    export.add_argument(
        "--rect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engine profile over heights and widths up to --imgsz, for rectangular batches "
        "(model.rect); --no-rect: the square only (default: rect)",
    )
    export.add_argument(
        "--half", action="store_true", help="FP16 (engine; onnx/torchscript on CUDA)"
    )
    export.add_argument("--int8", action="store_true", help="INT8 engine, calibrated on real clips")
    export.add_argument("--calib-clips", nargs="+", metavar="CLIP", help="clips for --int8")
    export.add_argument(
        "--calib-frames",
        type=int,
        default=256,
        metavar="N",
        help="frames for --int8 (default: %(default)s)",
    )
    export.add_argument(
        "--device",
        default="cpu",
        metavar="DEVICE",
        help="cpu or cuda:N (default: %(default)s)",
    )
    export.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from detectors.base import BackendUnavailable
    from detectors.export import ExportRequest, export

    request = ExportRequest(
        source=Path(args.model),
        format=args.format,
        output=Path(args.output) if args.output else None,
        imgsz=args.imgsz,
        max_batch=args.max_batch,
        opt_batch=args.opt_batch,
        rect=args.rect,
        half=args.half,
        int8=args.int8,
        calib_clips=tuple(Path(clip) for clip in args.calib_clips or ()),
        calib_frames=args.calib_frames,
        device=args.device,
    )
    try:
        if not request.source.is_file():
            raise FileNotFoundError(f"model file not found: {request.source}")
        written = export(request)
    except (ValueError, FileNotFoundError, BackendUnavailable) as exc:
        print(f"framebatch export: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in OPTIONAL_LIBRARIES:
            raise  # the project's own modules, the core's dependencies: a bug, not an extra
        print(f"framebatch export: {missing_library(request, missing)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB)")
    return EXIT_OK


def missing_library(request: Any, library: str) -> str:
    """One line naming what to install (``detectors.base.EXTRAS``'s wording)."""
    from detectors.base import EXTRAS

    extra = OPTIONAL_LIBRARIES[library]
    if extra == "ultralytics" and request.source.suffix.lower() == ".pt":
        return f"reading a .pt needs the ultralytics extra: {EXTRAS[extra]}"
    return f"export to {request.format} needs {library!r}, which is not installed: {EXTRAS[extra]}"
