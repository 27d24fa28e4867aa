"""Known models fetched into the cache, ready to run (``framebatch models fetch NAME``).

``NAME.onnx`` (dynamic batch, height and width: rectangular batches) is put in the cache, the
first way that works:

1. already there: kept;
2. the shared assets folder holds the same network as such an ONNX: linked, once its sha256
   matched;
3. download the official checkpoint from its pinned URL (or a mirror), keep it only if its
   sha256 matches, and export it with ``framebatch export``'s own ONNX exporter (which needs
   the optional ``ultralytics`` extra to read a ``.pt``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from detectors.base import BackendUnavailable
from detectors.catalog import KnownModel, model_path
from detectors.downloads import FetchError, download_verified, has_sha256, link_or_copy


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
