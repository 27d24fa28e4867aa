"""Getting a pinned file: link it from the assets folder when it is there, else download it and
check its sha256 before it appears under its name.  Used for the sample clips
(``samples.clips``) and the known models (``framebatch models fetch``).

The downloader is the standard library's ``urllib`` with a retry: a server that answers
badly (HTTP 5xx, 429, a connection cut mid-file) is tried again after 1 s, then 2 s; a server
that cannot be reached at all (a name that does not resolve, a refused or silent connection)
raises :class:`Unreachable` at once, within ``CONNECT_TIMEOUT_S`` even when the name server
itself does not answer, so a caller fetching several files stops after the first instead of
waiting out every one of them.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 16
DOWNLOAD_TIMEOUT_S = 60.0  # per connect or read once the server was reached
CONNECT_TIMEOUT_S = 5.0  # resolving and connecting: offline is known within this
ATTEMPTS = 3
BACKOFF_S = 1.0  # before the second attempt; doubled before each further one
RETRIED_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})
#: the assets folder (``videos/``, ``models/``) when not given by ``--assets``
ASSETS_ENV = "FRAMEBATCH_ASSETS"
DEFAULT_ASSETS = "../shared/assets"  # beside the clone


class FetchError(RuntimeError):
    """A pinned file could not be linked, copied or downloaded and verified."""


class Unreachable(FetchError):
    """The server (or the proxy before it) could not be resolved or connected to: most likely
    offline, and no use trying other files from it."""

    def __init__(self, server: str, reason: str) -> None:
        self.server = server  # host:port, or the proxy's
        self.reason = reason
        super().__init__(f"{server} unreachable ({reason})")


@dataclass(frozen=True)
class AssetsFolder:
    """Where pinned files are looked for first, and why there (said back to the user)."""

    path: Path | None  # None: not given, and no clone around this code to look beside
    origin: str  # "--assets", "$FRAMEBATCH_ASSETS" or the default

    @classmethod
    def of(cls, folder: AssetsFolder | Path | None) -> AssetsFolder:
        """A folder a library caller gave as a path (or none) as an ``AssetsFolder``."""
        if isinstance(folder, AssetsFolder):
            return folder
        return cls(folder, "the caller" if folder is not None else "none given")

    @property
    def exists(self) -> bool:
        return self.path is not None and self.path.is_dir()

    def describe(self, inside: str) -> str:
        """``/a/videos (from --assets: no such folder)``: the place looked in and why."""
        if self.path is None:
            return f"no assets folder ({self.origin})"
        state = "" if self.exists else ": no such folder"
        return f"{self.path / inside} (from {self.origin}{state})"


def locate_assets(
    repo_root: Path, explicit: Path | None = None, env: Mapping[str, str] = os.environ
) -> AssetsFolder:
    """The assets folder: ``explicit`` (``--assets``), else ``$FRAMEBATCH_ASSETS``, else
    ``../shared/assets`` beside the clone ``repo_root`` (when this code runs from a clone).
    It need not exist: a missing folder holds nothing, and the caller says where it looked."""
    if explicit is not None:
        return AssetsFolder(explicit, "--assets")
    if env.get(ASSETS_ENV):
        return AssetsFolder(Path(env[ASSETS_ENV]), f"${ASSETS_ENV}")
    if (repo_root / "pyproject.toml").is_file():
        return AssetsFolder(repo_root.parent / "shared" / "assets", f"the default {DEFAULT_ASSETS}")
    return AssetsFolder(None, f"not a clone, so no default {DEFAULT_ASSETS}")


def shared_assets_dir(repo_root: Path, explicit: Path | None = None) -> Path | None:
    """The assets folder (see :func:`locate_assets`) when it exists, else None."""
    folder = locate_assets(repo_root, explicit)
    return folder.path if folder.exists else None


class NotFetched(FetchError):
    """Files neither the assets folder nor a download provided, told as a few short lines:
    what is missing, where it looked, why nothing was downloaded, how to point elsewhere and
    the command that fetches once online."""

    def __init__(
        self,
        missing: str,
        *,
        looked_in: str,
        failures: Sequence[str],
        elsewhere: str,
        fetch_command: str,
        download_failed: bool,
    ) -> None:
        self.missing = missing
        self.looked_in = looked_in
        self.failures = list(dict.fromkeys(failures))  # each cause once
        self.elsewhere = elsewhere
        self.fetch_command = fetch_command
        #: a download was tried and failed (exit 3), rather than none possible (exit 2)
        self.download_failed = download_failed
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        """The message, a line each: what, where, why (two causes at most), what to do."""
        causes = self.failures[:2]
        if len(self.failures) > 2:
            causes.append(f"... and {len(self.failures) - 2} more")
        return [
            self.missing,
            f"looked in: {self.looked_in}",
            *causes,
            f"point elsewhere: {self.elsewhere}",
            f"fetch when online: {self.fetch_command}",
        ]


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


def check_reachable(url: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`Unreachable` unless a TCP connection to the URL's server (or to the proxy
    urllib would use for it) opens within ``timeout_s``, name resolution included."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return  # file:// and the like: urllib says what is wrong with them
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    server = f"{host}:{port}"
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if proxy_parts.hostname:
            host, port = proxy_parts.hostname, proxy_parts.port or 80
            server = f"the proxy {host}:{port} (${parts.scheme}_proxy)"
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    # a thread, because getaddrinfo takes no timeout: an unanswering name server would hold
    # the caller for 5 s per attempt and per address family, per file
    probe = threading.Thread(target=connect, name=f"reach-{host}", daemon=True)
    probe.start()
    probe.join(timeout_s)
    if not outcome:
        raise Unreachable(server, f"no answer within {timeout_s:g} s")
    if outcome[0] is not None:
        exc = outcome[0]
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise Unreachable(server, reason)


class _Transient(Exception):
    """A failure worth another attempt (said as its reason)."""


def download_verified(
    url: str,
    target: Path,
    sha256: str,
    *,
    what: str,
    attempts: int = ATTEMPTS,
    backoff_s: float = BACKOFF_S,
    say: Callable[[str], None] = lambda line: None,
) -> None:
    """Download ``url`` to ``target``; the file appears only once its sha256 matched (a
    partial or wrong download leaves nothing behind).  An unreachable server raises
    :class:`Unreachable` without retrying; a transient failure is retried up to ``attempts``
    times in all, waiting ``backoff_s``, then twice that, and so on."""
    prefix = f"download of {what} from {url} failed"
    check_reachable(url)
    # A plain name, not mkstemp: mkstemp's 0600 mode would stick to the file.
    partial = target.with_name(f".{target.name}.part")
    for attempt in range(1, attempts + 1):
        try:
            digest = _download_once(url, partial, prefix=prefix)
            if digest != sha256:
                raise FetchError(
                    f"download of {what} from {url} has sha256 {digest}, expected {sha256}: not "
                    "kept (a changed upstream file, a proxy's error page, or a tampered mirror)"
                )
            os.replace(partial, target)
            return
        except _Transient as exc:
            if attempt == attempts:
                tries = f" ({attempts} tries)" if attempts > 1 else ""
                raise FetchError(f"{prefix}: {exc}{tries}") from exc
            wait_s = backoff_s * 2 ** (attempt - 1)
            say(f"retry      {url} in {wait_s:g} s ({exc})")
            time.sleep(wait_s)
        finally:
            partial.unlink(missing_ok=True)


def _download_once(url: str, partial: Path, *, prefix: str) -> str:
    """One attempt: the body into ``partial``, returning its sha256.  Raises ``_Transient``
    for what another attempt may cure, ``FetchError`` for what it will not."""
    request = urllib.request.Request(url, headers={"User-Agent": "framebatch"})
    digest = hashlib.sha256()
    try:
        out = partial.open("wb")
    except OSError as exc:
        raise FetchError(f"{prefix}: cannot write {partial} ({exc.strerror})") from exc
    try:
        with out, urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
            expected = response.headers.get("Content-Length")
            received = 0
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                received += len(chunk)
            # read(n) ends quietly when the server hangs up early: a cut, not a wrong file
            if expected is not None and expected.isdigit() and received < int(expected):
                raise _Transient(f"connection closed after {received} of {expected} bytes")
    except urllib.error.HTTPError as exc:
        reason = f"HTTP {exc.code} {exc.reason}"
        if exc.code in RETRIED_HTTP:
            raise _Transient(reason) from exc
        raise FetchError(f"{prefix}: {reason}") from exc
    except urllib.error.URLError as exc:
        raise _Transient(str(exc.reason)) from exc
    except (OSError, http.client.HTTPException) as exc:  # reset, timeout, cut short
        raise _Transient(str(exc) or type(exc).__name__) from exc
    return digest.hexdigest()
