"""Known models fetched into the cache, ready to run (``framebatch models fetch NAME``).

``NAME.onnx`` (dynamic batch, height and width: rectangular batches) is put in the cache, the
first way that works:

1. already there: kept;
2. the assets folder (``--assets``, ``$FRAMEBATCH_ASSETS``, else ``../shared/assets`` beside
   the clone) holds the same network as such an ONNX: linked, once its sha256 matched;
3. the official checkpoint, verified in the cache already or downloaded from its pinned URL (or
   a mirror) and kept only if its sha256 matches, is exported with ``framebatch export``'s own
   ONNX exporter (which needs the optional ``ultralytics`` extra to read a ``.pt``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from detectors.base import BackendUnavailable
from detectors.catalog import KnownModel, model_path
from detectors.downloads import (
    ASSETS_ENV,
    AssetsFolder,
    FetchError,
    NotFetched,
    Unreachable,
    download_verified,
    has_sha256,
    link_or_copy,
)


def fetch_model(
    model: KnownModel,
    *,
    cache: Path,
    assets_dir: AssetsFolder | Path | None,
    allow_download: bool,
    mirror: str | None = None,
    export: bool = True,
    say: Callable[[str], None] = lambda line: None,
) -> Path:
    """The model's ready ONNX in ``cache`` (see the module's docstring for the order tried);
    with ``export=False``, the verified checkpoint instead when the ONNX is not there yet.  A
    checkpoint already in the cache and verified is used even without ``allow_download``.

    Raises ``NotFetched`` (a ``FetchError``) when neither the assets folder nor a download
    provided the model, else ``FetchError`` naming what failed; a failed fetch leaves no file
    behind."""
    assets = AssetsFolder.of(assets_dir)
    target = model_path(model.name, cache)
    if target.is_file():
        say(f"present    {target}")
        return target
    cache.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)  # a dangling link from a moved assets folder
    shared = assets.path / model.shared_onnx if assets.path is not None else None
    if shared is not None and shared.is_file():
        if not has_sha256(shared, model.shared_onnx_sha256):
            raise FetchError(f"{shared} does not have the expected sha256")
        how = link_or_copy(shared, target)
        say(f"{how:<10} {target} <- {shared}")
        return target
    checkpoint = cache / model.checkpoint_name
    if has_sha256(checkpoint, model.checkpoint_sha256):
        say(f"present    {checkpoint} (sha256 ok)")
    else:
        if not allow_download:
            failure = "not downloaded: downloads are off (--no-download)"
            raise _not_fetched(model, cache, assets, failure, download_failed=False)
        url = f"{mirror.rstrip('/')}/{model.checkpoint_name}" if mirror else model.checkpoint_url
        say(f"download   {url}")
        try:
            download_verified(
                url, checkpoint, model.checkpoint_sha256, what=model.checkpoint_name, say=say
            )
        except FetchError as exc:
            failure = f"download failed: {exc}" if isinstance(exc, Unreachable) else str(exc)
            raise _not_fetched(model, cache, assets, failure, download_failed=True) from exc
        say(f"downloaded {checkpoint} (sha256 ok)")
    if not export:
        return checkpoint
    export_onnx(checkpoint, target)
    say(f"exported   {target}")
    return target


def _not_fetched(
    model: KnownModel, cache: Path, assets: AssetsFolder, failure: str, *, download_failed: bool
) -> NotFetched:
    return NotFetched(
        f"{model.name} is not in the cache {cache}",
        looked_in=assets.describe(model.shared_onnx),
        failures=[failure],
        elsewhere=f"--assets PATH, {ASSETS_ENV}=PATH, or model.path: FILE.onnx in the config",
        fetch_command=f"framebatch models fetch {model.name}",
        download_failed=download_failed,
    )


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
            f"optional extra: {exc} (from a clone: bash deploy/bootstrap.sh --export)"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)
