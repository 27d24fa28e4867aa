"""``framebatch check-config``: every error of a config, each with its dotted path, and what can
be checked without loading the model or opening a camera: the model file (there, not empty, its
first bytes those of its backend's files) and every file camera's file (there, readable)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipeline.cli.common import report
from pipeline.errors import EXIT_OK


def register(commands: Any) -> None:
    check = commands.add_parser(
        "check-config",
        help="validate a config and list every error, then check its model and camera files "
        "(nothing loaded, no camera contacted)",
    )
    check.add_argument("config", metavar="CONFIG", help="YAML config file")
    check.add_argument(
        "--until-done",
        action="store_true",
        help="also check it suits run --until-done (no looping file, at least one file)",
    )
    check.add_argument(
        "--no-files",
        action="store_true",
        help="validate the config alone, without looking for its model and camera files (a "
        "config for a container or another machine, whose paths are not here)",
    )
    check.set_defaults(handler=cmd_check_config)


def cmd_check_config(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_config
    from pipeline.supervisor.builders import check_run_mode

    try:
        config = load_config(args.config)
        errors: list[str] = []
        try:
            check_run_mode(config, until_done=args.until_done)
        except ConfigError as exc:  # its lines, under the config file's name
            errors += exc.errors
        if args.no_files:
            checked = f"{_cameras(len(config.cameras))}, model {config.model.path.name}; "
            checked += "files not checked"
        else:
            model, model_errors = check_model(config.model)
            cameras, camera_errors = check_camera_files(config.cameras)
            errors += model_errors + camera_errors
            checked = f"{cameras}; {model}"
        if errors:
            raise ConfigError(errors, source=args.config)
    except ConfigError as exc:
        return report(exc)
    print(f"{args.config}: ok ({checked})")
    return EXIT_OK


def check_model(model: Any) -> tuple[str, list[str]]:
    """What the model file is (``model yolov8n.onnx: onnxruntime, 12.3 MB, not loaded``),
    or the problems with it, each as a ``model.path: ...`` line."""
    from detectors.backends import backend_name_for, check_model_file, plugin

    path: Path = model.path
    try:
        backend = backend_name_for(path, model.backend)
        check_model_file(path, backend)
        size = path.stat().st_size
    except (OSError, ValueError) as exc:
        detail = f"cannot read {path}: {exc.strerror or exc}" if _unreadable(exc) else str(exc)
        return "", [f"model.path: {detail}"]
    checked = "" if plugin(backend).magic else ", contents not checked"
    return f"model {path.name}: {backend}, {size / 1e6:.1f} MB{checked}, not loaded", []


def check_camera_files(cameras: list[Any]) -> tuple[str, list[str]]:
    """How many cameras, how many of them files found (live ones are not contacted), or a
    ``cameras[i].url: ...`` line for each file that is missing or unreadable."""
    errors, files = [], 0
    for i, camera in enumerate(cameras):
        if camera.is_live:
            continue
        path = Path(camera.url)
        if not path.exists():
            errors.append(f"cameras[{i}].url: file not found: {path}")
        elif path.is_dir():
            errors.append(f"cameras[{i}].url: {path} is a folder, not a video file")
        else:
            try:
                with path.open("rb") as file:
                    file.read(1)
            except OSError as exc:
                errors.append(f"cameras[{i}].url: cannot read {path}: {exc.strerror or exc}")
                continue
            files += 1
    live = len(cameras) - files - len(errors)
    found = f"{files} {'file' if files == 1 else 'files'} found"
    found += f", {live} live, not contacted" if live else ""
    return f"{_cameras(len(cameras))}: {found}", errors


def _cameras(count: int) -> str:
    return f"{count} camera{'s' if count != 1 else ''}"


def _unreadable(exc: BaseException) -> bool:
    """An OSError about the file itself (permissions, a folder), not "not found" (whose
    message from ``check_model_file`` already says where to get the model)."""
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)
