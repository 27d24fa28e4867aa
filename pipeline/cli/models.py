"""``framebatch models``: fetch a known model (:mod:`detectors.fetch`) into the cache, or list
the known ones."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from detectors.catalog import CACHE_ENV, KNOWN_MODELS, cache_dir, model_path
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
    parser.set_defaults(handler=run_models)


def run_models(args: argparse.Namespace) -> int:
    from detectors.downloads import FetchError, shared_assets_dir
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
