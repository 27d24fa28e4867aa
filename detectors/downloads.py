"""Getting a pinned file: link it from the shared assets folder when it is there, else download
it and check its sha256 before it appears under its name.  Used for the sample clips
(``samples.clips``) and the known models (``framebatch models fetch``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

CHUNK = 1 << 16
DOWNLOAD_TIMEOUT_S = 60.0


class FetchError(RuntimeError):
    """A pinned file could not be linked, copied or downloaded and verified."""


def shared_assets_dir(repo_root: Path, explicit: Path | None = None) -> Path | None:
    """The shared assets folder, or None when there is none: ``explicit`` when given (it must
    exist), else ``repo_root/../shared/assets`` if it exists."""
    if explicit is not None:
        if not explicit.is_dir():
            raise FetchError(f"assets folder {explicit} does not exist")
        return explicit
    default = repo_root.parent / "shared" / "assets"
    return default if default.is_dir() else None


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's content (following symlinks)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def has_sha256(path: Path, sha256: str) -> bool:
    """The file is there (a dangling link is not) and has this content."""
    return path.is_file() and sha256_of(path) == sha256


def link_or_copy(source: Path, target: Path) -> str:
    """Symlink ``target`` -> ``source`` (relative when possible); copy where links fail."""
    try:
        link = os.path.relpath(source, target.parent)
    except ValueError:  # different drives on Windows: no relative path exists
        link = str(source)
    try:
        target.symlink_to(link)
        return "linked"
    except OSError:
        # e.g. a filesystem without symlinks. copyfile, not copy2: the shared assets are
        # read-only and the copy should not be.
        shutil.copyfile(source, target)
        return "copied"


def download_verified(url: str, target: Path, sha256: str, *, what: str) -> None:
    """Download ``url`` to ``target``; the file appears only once its sha256 matched (a
    partial or wrong download leaves nothing behind)."""
    request = urllib.request.Request(url, headers={"User-Agent": "framebatch"})
    # A plain name, not mkstemp: mkstemp's 0600 mode would stick to the file.
    partial = target.with_name(f".{target.name}.part")
    try:
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            try:
                with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
                    while chunk := response.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            except urllib.error.HTTPError as exc:
                reason = f"HTTP {exc.code} {exc.reason}"
                raise FetchError(f"download of {what} from {url} failed: {reason}") from exc
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise FetchError(f"download of {what} from {url} failed: {reason}") from exc
        if digest.hexdigest() != sha256:
            raise FetchError(
                f"download of {what} from {url} has sha256 {digest.hexdigest()}, expected "
                f"{sha256}: not kept (a changed upstream file, a proxy's error page, or a "
                "tampered mirror)"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
