"""``framebatch models``: get a known model (``detectors.catalog``) ready to run.

``fetch NAME`` puts ``NAME.onnx`` (dynamic batch, height and width: rectangular batches) in
the cache, the first way that works:

1. already there: kept;
2. ``../shared/assets`` (or ``--assets``) holds the same network as such an ONNX: linked,
   once its sha256 matched;
3. download the official checkpoint from its pinned URL (or ``--mirror``), keep it only if
   its sha256 matches, and export it with ``framebatch export``'s own ONNX exporter (which
   needs the optional ``ultralytics`` extra to read a ``.pt``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from detectors.base import BackendUnavailable
from detectors.catalog import CACHE_ENV, KNOWN_MODELS, KnownModel, cache_dir, model_path
from detectors.downloads import (
    FetchError,
    download_verified,
    has_sha256,
    link_or_copy,
    shared_assets_dir,
)
from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUN_FAILED

REPO_ROOT = Path(__file__).resolve().parents[2]
MIRROR_ENV = "FRAMEBATCH_MODEL_MIRROR"


def fetch_model(
    model: KnownModel,
    *,
    cache: Path,
    assets_dir: Path | None,
    allow_download: bool,
    mirror: str | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> Path:
    """The model's ready ONNX in ``cache`` (see the module's docstring for the order tried).
    Raises ``FetchError`` naming what failed; a failed fetch leaves no file behind."""
    target = model_path(model.name, cache)
    if target.is_file():
        say(f"present    {target}")
        return target
    cache.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)  # a dangling link from a moved assets folder
    shared = assets_dir / model.shared_onnx if assets_dir is not None else None
    if shared is not None and shared.is_file():
        if not has_sha256(shared, model.shared_onnx_sha256):
            raise FetchError(f"{shared} does not have the expected sha256")
        how = link_or_copy(shared, target)
        say(f"{how:<10} {target} <- {shared}")
        return target
    if not allow_download:
        where = f"not in {assets_dir}" if assets_dir is not None else "no shared assets"
        raise FetchError(f"{model.name}: {where}, and downloads are off (--no-download)")
    checkpoint = cache / model.checkpoint_name
    if has_sha256(checkpoint, model.checkpoint_sha256):
        say(f"present    {checkpoint} (sha256 ok)")
    else:
        url = f"{mirror.rstrip('/')}/{model.checkpoint_name}" if mirror else model.checkpoint_url
        say(f"download   {url}")
        download_verified(url, checkpoint, model.checkpoint_sha256, what=model.checkpoint_name)
        say(f"downloaded {checkpoint} (sha256 ok)")
    export_onnx(checkpoint, target)
    say(f"exported   {target}")
    return target


def export_onnx(checkpoint: Path, target: Path) -> None:
    """The checkpoint as an ONNX with dynamic batch, height and width, written under a
    temporary name and renamed, so an interrupted export is never taken for a model."""
    from detectors.export import ExportRequest, export

    partial = target.with_name(f".{target.stem}.part.onnx")
    try:
        export(ExportRequest(source=checkpoint, format="onnx", output=partial))
        os.replace(partial, target)
    except BackendUnavailable as exc:
        raise FetchError(
            f"{checkpoint.name} is downloaded and verified; exporting it to ONNX needs the "
            f"optional extra: {exc}"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="models_command", required=True)
    fetch = actions.add_parser(
        "fetch", help=f"put a known model's ONNX in the cache (${CACHE_ENV}, else ~/.cache)"
    )
    fetch.add_argument("name", choices=sorted(KNOWN_MODELS), help="the known model")
    fetch.add_argument(
        "--assets", type=Path, help="shared assets folder (default: ../shared/assets if there)"
    )
    fetch.add_argument(
        "--no-download", action="store_true", help="only link from the shared assets"
    )
    fetch.add_argument(
        "--mirror",
        default=os.environ.get(MIRROR_ENV),
        help=f"base URL holding the official checkpoints (default: ${MIRROR_ENV}, else the "
        "pinned upstream URL); the sha256 is checked either way",
    )
    actions.add_parser("list", help="the known models, their pinned sources and cache state")


def run_models(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        for model in KNOWN_MODELS.values():
            path = model_path(model.name)
            state = "fetched" if path.is_file() else "not fetched"
            print(f"{model.name}  {state}: {path}")
            print(f"  checkpoint {model.checkpoint_url}")
            print(f"  sha256 {model.checkpoint_sha256} ({model.checkpoint_bytes:,} bytes)")
            print(f"  license {model.license}")
        return EXIT_OK
    model = KNOWN_MODELS[args.name]
    cache = cache_dir()
    try:
        assets = shared_assets_dir(REPO_ROOT, args.assets)
        path = fetch_model(
            model,
            cache=cache,
            assets_dir=assets,
            allow_download=not args.no_download,
            mirror=args.mirror,
            say=print,
        )
    except FetchError as exc:
        print(f"framebatch models fetch: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT if args.no_download else EXIT_RUN_FAILED
    print(f"{model.name} ready: {path} (configs may say model.path: {model.name})")
    return EXIT_OK
