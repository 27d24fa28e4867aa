"""``framebatch models``: fetch a known model (:mod:`detectors.fetch`) into the cache, or list
the known ones."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from detectors.catalog import CACHE_ENV, KNOWN_MODELS, cache_dir, model_path
from detectors.downloads import ASSETS_ENV
from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUN_FAILED

REPO_ROOT = Path(__file__).resolve().parents[2]
MIRROR_ENV = "FRAMEBATCH_MODEL_MIRROR"


def register(commands: Any) -> None:
    parser = commands.add_parser("models", help="fetch a known model (yolov8n) into the cache")
    actions = parser.add_subparsers(dest="models_command", required=True)
    fetch = actions.add_parser(
        "fetch", help=f"put a known model's ONNX in the cache (${CACHE_ENV}, else ~/.cache)"
    )
    fetch.add_argument("name", choices=sorted(KNOWN_MODELS), help="the known model")
    fetch.add_argument(
        "--assets",
        type=Path,
        metavar="PATH",
        help=f"assets folder holding models/ (default: ${ASSETS_ENV}, else ../shared/assets "
        "beside the clone)",
    )
    fetch.add_argument(
        "--no-download", action="store_true", help="only what is on disk: the assets, the cache"
    )
    fetch.add_argument(
        "--no-export",
        action="store_true",
        help="stop once the checkpoint is verified, before the export that needs the "
        "ultralytics extra (a later fetch exports it)",
    )
    fetch.add_argument(
        "--mirror",
        metavar="URL",
        default=os.environ.get(MIRROR_ENV),
        help=f"base URL holding the official checkpoints (default: ${MIRROR_ENV}, else the "
        "pinned upstream URL); the sha256 is checked either way",
    )
    actions.add_parser("list", help="the known models, their pinned sources and cache state")
    parser.set_defaults(handler=run_models)


def run_models(args: argparse.Namespace) -> int:
    from detectors.downloads import FetchError, NotFetched, locate_assets
    from detectors.fetch import fetch_model

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
    try:
        path = fetch_model(
            model,
            cache=cache_dir(),
            assets_dir=locate_assets(REPO_ROOT, args.assets),
            allow_download=not args.no_download,
            mirror=args.mirror,
            export=not args.no_export,
            say=print,
        )
    except NotFetched as exc:
        # no way to the model at all is bad input (2); a download that failed is a failed run
        # (3): a later try may work
        first, *rest = exc.lines()
        print(
            f"framebatch models fetch: {first}",
            *(f"  {line}" for line in rest),
            sep="\n",
            file=sys.stderr,
        )
        return EXIT_RUN_FAILED if exc.download_failed else EXIT_BAD_INPUT
    except FetchError as exc:
        print(f"framebatch models fetch: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED
    if path.suffix != ".onnx":
        print(
            f"{model.name}: checkpoint verified, not exported (--no-export): "
            f"`framebatch models fetch {model.name}` exports it (needs the ultralytics extra)"
        )
        return EXIT_OK
    print(f"{model.name} ready: {path} (configs may say model.path: {model.name})")
    return EXIT_OK
