"""Known models: a name a config may give as ``model.path`` (``yolov8n``) instead of a file,
the official checkpoint behind it (URL and sha256, pinned), and where the ready ONNX lives.

``framebatch models fetch NAME`` fills the cache (:mod:`detectors.fetch`); the config
turns a known name into the cached ONNX's path, and loading a name not fetched yet says which
command fetches it.  Nothing here downloads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "FRAMEBATCH_CACHE"


@dataclass(frozen=True)
class KnownModel:
    """One known model and where each of its files comes from."""

    name: str
    checkpoint_url: str  # the official Ultralytics checkpoint, at a fixed release
    checkpoint_sha256: str
    checkpoint_bytes: int
    license: str
    # the same network as an ONNX with dynamic batch, height and width in ../shared/assets (the
    # project's test data), linked instead of downloading and exporting when present
    shared_onnx: str
    shared_onnx_sha256: str

    @property
    def checkpoint_name(self) -> str:
        return self.checkpoint_url.rsplit("/", 1)[-1]


KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            name="yolov8n",
            # the v0.0.0 release asset every YOLOv8 release of Ultralytics resolves to; the
            # sha256 and size as pinned by several independent public projects (this project
            # has never downloaded it: its build machines have no internet)
            checkpoint_url="https://github.com/ultralytics/assets/releases/download/v0.0.0/yolov8n.pt",
            checkpoint_sha256="31e20dde3def09e2cf938c7be6fe23d9150bbbe503982af13345706515f2ef95",
            checkpoint_bytes=6_534_387,
            license="AGPL-3.0 (Ultralytics)",
            shared_onnx="models/yolov8n-coco_ultralytics_dynamic.onnx",
            shared_onnx_sha256="b253bd6a3884e40b95704067fef8d9a4bc760f5836838bcaec280aaa7f3a85b4",
        ),
    )
}


def cache_dir() -> Path:
    """Where fetched models live: ``$FRAMEBATCH_CACHE``, else ``$XDG_CACHE_HOME/framebatch``,
    else ``~/.cache/framebatch``; models in its ``models/``."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "framebatch")
    return Path(root) / "models"


def model_path(name: str, cache: Path | None = None) -> Path:
    """The ready ONNX of a known model (there once fetched)."""
    return (cache or cache_dir()) / f"{name}.onnx"


def known_name(path: Path) -> str | None:
    """The known model a config's ``model.path`` names (a bare name, no folder, no suffix)."""
    text = str(path)
    return text if text in KNOWN_MODELS else None


def fetch_hint(path: Path) -> str | None:
    """For a missing file that is a known model's cache entry: how to fetch it."""
    if path.parent == cache_dir() and path.suffix == ".onnx" and path.stem in KNOWN_MODELS:
        return f"model {path.stem} is not fetched yet: run `framebatch models fetch {path.stem}`"
    return None
