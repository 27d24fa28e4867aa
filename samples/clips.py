"""Real third-party sample clips: where they come from and how to get them locally.

The clips themselves are never committed. ``fetch_real_clips`` puts them into the
git-ignored ``samples/clips/real/``: as symlinks into ``../shared/assets/videos``
when that folder exists beside the repository, otherwise by downloading them from
their upstream repositories and checking their sha256.

Usage::

    python -m samples.clips fetch [--dest samples/clips/real] [--assets DIR] [--no-download]
    python -m samples.clips list
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from detectors.downloads import (
    FetchError,
    download_verified,
    has_sha256,
    link_or_copy,
    sha256_of,
    shared_assets_dir,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = REPO_ROOT / "samples" / "clips" / "real"


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
    assets_dir: Path | None,
    allow_download: bool,
    clips: Iterable[SampleClip] = REAL_CLIPS,
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """Make every clip available in ``dest`` and return their paths.

    A clip already in ``dest`` with the right sha256 is kept. Otherwise it is
    symlinked (or copied) from ``assets_dir / "videos"`` when present there, else
    downloaded if ``allow_download``. Raises ``FetchError`` naming every clip that
    could not be provided, after trying all of them.
    """
    say = log or (lambda _msg: None)
    dest.mkdir(parents=True, exist_ok=True)
    videos = assets_dir / "videos" if assets_dir is not None else None
    done: list[Path] = []
    failures: list[str] = []
    for clip in clips:
        target = dest / clip.filename
        if _is_good(target, clip):
            say(f"present    {target}")
            done.append(target)
            continue
        try:
            src = videos / clip.filename if videos is not None else None
            if src is not None and src.is_file():
                if sha256_of(src) != clip.sha256:
                    raise FetchError(f"{src} does not have the expected sha256 {clip.sha256}")
                target.unlink(missing_ok=True)
                how = link_or_copy(src, target)
                say(f"{how:<10} {target} <- {src}")
            elif allow_download:
                target.unlink(missing_ok=True)
                say(f"download   {clip.url}")
                download_verified(clip.url, target, clip.sha256, what=clip.name)
                say(f"downloaded {target} (sha256 ok)")
            else:
                where = f"not in {videos}" if videos is not None else "no shared assets"
                raise FetchError(f"{clip.filename}: {where} and downloads are disabled")
        except FetchError as exc:
            say(f"FAILED     {exc}")
            failures.append(str(exc))
            continue
        done.append(target)
    if failures:
        raise FetchError("; ".join(failures))
    return done


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: ``fetch`` the real clips or ``list`` them."""
    parser = argparse.ArgumentParser(
        prog="python -m samples.clips", description="Fetch the real sample clips."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="link/copy from shared assets, else download")
    fetch.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="target folder")
    fetch.add_argument(
        "--assets", type=Path, default=None, help="assets folder (default: ../shared/assets)"
    )
    fetch.add_argument(
        "--no-download", action="store_true", help="only use the shared assets, never download"
    )
    sub.add_parser("list", help="print the clip table")
    args = parser.parse_args(argv)

    if args.command == "list":
        for c in REAL_CLIPS:
            print(
                f"{c.filename}  {c.width}x{c.height} {c.fps:.3f} fps {c.frames} frames  "
                f"{c.license}  {c.source}"
            )
        return 0

    try:
        assets = shared_assets_dir(REPO_ROOT, args.assets)
        print(f"assets: {assets if assets is not None else 'none found'}")
        print(f"dest:   {_display(args.dest)}")
        paths = fetch_real_clips(
            args.dest, assets_dir=assets, allow_download=not args.no_download, log=print
        )
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(paths)} clip(s) ready in {_display(args.dest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
