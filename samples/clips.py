"""Real third-party sample clips: where they come from and how to get them locally.

The clips themselves are never committed. ``fetch_real_clips`` puts them into the
git-ignored ``samples/clips/real/``: as symlinks into the assets folder's ``videos/``
(``--assets``, ``$FRAMEBATCH_ASSETS``, else ``../shared/assets`` beside the repository)
when they are there, otherwise by downloading them from their upstream repositories and
checking their sha256.

Usage::

    python -m samples.clips fetch [--dest samples/clips/real] [--assets DIR] [--no-download]
                                  [--mirror URL]
    python -m samples.clips list
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from detectors.downloads import (
    ASSETS_ENV,
    AssetsFolder,
    FetchError,
    NotFetched,
    Unreachable,
    download_verified,
    has_sha256,
    link_or_copy,
    locate_assets,
    sha256_of,
    shared_assets_dir,  # noqa: F401 - importable from here, as samples/README.md shows
)
from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUN_FAILED

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = REPO_ROOT / "samples" / "clips" / "real"
PROG = "python -m samples.clips"


@dataclass(frozen=True)
class SampleClip:
    """One real clip: local file name, stream facts, license and where to download it."""

    name: str
    filename: str
    width: int
    height: int
    fps: float
    frames: int
    license: str
    source: str
    url: str
    sha256: str


# URLs are pinned to the upstream commit the shared assets were taken from, so the
# sha256 below stays valid even if the upstream branch changes. The files in
# ../shared/assets/videos are byte-identical to these upstream blobs (same git blob
# ids), only renamed.
REAL_CLIPS: tuple[SampleClip, ...] = (
    SampleClip(
        name="street_night",
        filename="street_night_1920x1080_3fps.mp4",
        width=1920,
        height=1080,
        fps=3.0,
        frames=8,
        license="Apache-2.0",
        source="open-mmlab/mmtracking demo/demo.mp4",
        url=(
            "https://github.com/open-mmlab/mmtracking/raw/"
            "e79491ec8f0b8c86fda947fbaaa824c66ab2a991/demo/demo.mp4"
        ),
        sha256="9003ee7c9cb26fcb364dd65b98ab2580a7c524b380acd6ff28717957aaec4569",
    ),
    SampleClip(
        name="highway_traffic",
        filename="highway_traffic_960x540_30fps.mp4",
        width=960,
        height=540,
        fps=30000 / 1001,
        frames=335,
        license="MIT",
        source="DeGirum/PySDKExamples images/Traffic.mp4",
        url=(
            "https://github.com/DeGirum/PySDKExamples/raw/"
            "30c9a54bf79a7cae33643a417167bb763e4f57ee/images/Traffic.mp4"
        ),
        sha256="4a4f00da283781c89fdef525eeae99ed8c72167de2b73bf4e82a9b8cfbae6378",
    ),
    SampleClip(
        name="highway_traffic_hd",
        filename="highway_traffic_1920x1080_30fps_20frames.mp4",
        width=1920,
        height=1080,
        fps=30.0,
        frames=20,
        license="MIT",
        source="DeGirum/PySDKExamples tests/images/TrafficHD_short.mp4",
        url=(
            "https://github.com/DeGirum/PySDKExamples/raw/"
            "30c9a54bf79a7cae33643a417167bb763e4f57ee/tests/images/TrafficHD_short.mp4"
        ),
        sha256="c885e000c436b6ba6492fc230f9c6e42dbc242804d1402756089faea2fb03082",
    ),
    SampleClip(
        name="indoor_person",
        filename="indoor_person_768x432_10fps.mp4",
        width=768,
        height=432,
        fps=10.0,
        frames=1394,
        license="CC-BY-4.0",
        source="intel-iot-devkit/sample-videos one-by-one-person-detection.mp4",
        url=(
            "https://github.com/intel-iot-devkit/sample-videos/raw/"
            "57978890822836f2b4743852f04f62fc511757e4/one-by-one-person-detection.mp4"
        ),
        sha256="a5964aa259099a482a8b360ffc2c57b5a30f84d5919236a4dad01f8e929ac07c",
    ),
)


def _is_good(path: Path, clip: SampleClip) -> bool:
    # A dangling symlink or a stale/partial file is replaced, not trusted.
    return has_sha256(path, clip.sha256)


def fetch_real_clips(
    dest: Path,
    *,
    assets_dir: AssetsFolder | Path | None,
    allow_download: bool,
    clips: Iterable[SampleClip] = REAL_CLIPS,
    mirror: str | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """Make every clip available in ``dest`` and return their paths.

    A clip already in ``dest`` with the right sha256 is kept. Otherwise it is symlinked (or
    copied) from the assets folder's ``videos/`` when present there, else downloaded if
    ``allow_download`` (from ``mirror/<file name>`` when a mirror is given).  The first
    download whose server cannot be reached ends the downloads: the rest would wait for the
    same dead network.  Raises ``NotFetched`` naming what is missing, after trying the others.
    """
    say = log or (lambda _msg: None)
    assets = AssetsFolder.of(assets_dir)
    videos = assets.path / "videos" if assets.path is not None else None
    clips = tuple(clips)
    done: list[Path] = []
    missing: list[SampleClip] = []
    failures: list[str] = []
    unreachable = False  # once a server is: offline, so no more downloads
    download_failed = False
    for clip in clips:
        target = dest / clip.filename
        if _is_good(target, clip):
            say(f"present    {target}")
            done.append(target)
            continue
        src = videos / clip.filename if videos is not None else None
        if src is not None and src.is_file():
            if sha256_of(src) == clip.sha256:
                dest.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)
                how = link_or_copy(src, target)
                say(f"{how:<10} {target} <- {src}")
                done.append(target)
                continue
            failures.append(f"{src} does not have the expected sha256 {clip.sha256}")
        elif not allow_download:
            failures.append("not downloaded: downloads are off (--no-download)")
        elif not unreachable:
            dest.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            url = f"{mirror.rstrip('/')}/{clip.filename}" if mirror else clip.url
            say(f"download   {url}")
            try:
                download_verified(url, target, clip.sha256, what=clip.name, say=say)
            except Unreachable as exc:
                unreachable = True
                failures.append(f"download failed: {exc}; nothing more downloaded")
            except FetchError as exc:
                failures.append(str(exc))
            else:
                say(f"downloaded {target} (sha256 ok)")
                done.append(target)
                continue
            download_failed = True
        missing.append(clip)
    if missing:
        names = "" if len(missing) == len(clips) else ": " + ", ".join(c.name for c in missing)
        raise NotFetched(
            f"{len(missing)} of {len(clips)} sample clips missing in {_display(dest)}{names}",
            looked_in=assets.describe("videos"),
            failures=failures,
            elsewhere=f"--assets PATH or {ASSETS_ENV}=PATH (a folder holding videos/)",
            fetch_command="python -m samples.clips fetch",
            download_failed=download_failed,
        )
    return done


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: ``fetch`` the real clips or ``list`` them.  ``fetch`` exits 2 when a
    clip is missing and there was no way to it (``--no-download``, a bad assets file), 3 when
    a download failed (offline, a dead mirror): a few lines on stderr say what to do."""
    parser = argparse.ArgumentParser(prog=PROG, description="Fetch the real sample clips.")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="link/copy from the assets folder, else download")
    fetch.add_argument(
        "--dest", type=Path, default=DEFAULT_DEST, metavar="PATH", help="target folder"
    )
    fetch.add_argument(
        "--assets",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"assets folder holding videos/ (default: ${ASSETS_ENV}, else ../shared/assets "
        "beside the clone)",
    )
    fetch.add_argument(
        "--no-download", action="store_true", help="only use the assets folder, never download"
    )
    fetch.add_argument(
        "--mirror",
        metavar="URL",
        help="base URL holding the clips under their file names (default: the pinned upstream "
        "URLs); the sha256 is checked either way",
    )
    sub.add_parser("list", help="print the clip table")
    args = parser.parse_args(argv)

    if args.command == "list":
        for c in REAL_CLIPS:
            print(
                f"{c.filename}  {c.width}x{c.height} {c.fps:.3f} fps {c.frames} frames  "
                f"{c.license}  {c.source}"
            )
        return EXIT_OK

    try:
        paths = fetch_real_clips(
            args.dest,
            assets_dir=locate_assets(REPO_ROOT, args.assets),
            allow_download=not args.no_download,
            mirror=args.mirror,
            log=print,
        )
    except NotFetched as exc:
        first, *rest = exc.lines()
        print(f"{PROG} fetch: {first}", *(f"  {line}" for line in rest), sep="\n", file=sys.stderr)
        return EXIT_RUN_FAILED if exc.download_failed else EXIT_BAD_INPUT
    except FetchError as exc:
        print(f"{PROG} fetch: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED
    print(f"{len(paths)} clip(s) ready in {_display(args.dest)}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
