"""Generate the small synthetic test clips in ``samples/clips/`` with ffmpeg.

Clips made here (all tiny, made from ffmpeg's lavfi sources, Apache-2.0 like the project):

* ``testsrc_640x360_15fps.mp4``  H.264, 640x360, 15 fps, 4 s = 60 frames, GOP 15.
* ``bars_320x240_5fps.mp4``      H.264, 320x240, 5 fps, 4 s = 20 frames, GOP 5.
* ``corrupt_truncated.mp4``      a valid 320x240 15 fps H.264 mp4 (moov first) with
  1 KiB inverted a quarter into the media data and the file cut halfway through
  it: the container opens, decoding fails part way.
* ``not_a_video.mp4``            a line of plain text with an .mp4 name.

Usage::

    python -m samples.generate [--out samples/clips] [--ffmpeg /usr/bin/ffmpeg]
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "clips"

CORRUPT_FILENAME = "corrupt_truncated.mp4"
NOT_A_VIDEO_FILENAME = "not_a_video.mp4"
NOT_A_VIDEO_BYTES = b"framebatch sample: this is plain text, not a video.\n"


@dataclass(frozen=True)
class SyntheticClip:
    """An H.264 mp4 encoded from one ffmpeg lavfi source."""

    filename: str
    source: str  # lavfi source name, e.g. "testsrc2"
    width: int
    height: int
    fps: int
    seconds: int
    gop: int
    crf: int = 32  # high enough to keep every clip far below 300 KB

    @property
    def frames(self) -> int:
        """Number of frames the clip holds."""
        return self.fps * self.seconds

    @property
    def lavfi(self) -> str:
        """The lavfi input graph."""
        return f"{self.source}=size={self.width}x{self.height}:rate={self.fps}"


SYNTHETIC_CLIPS: tuple[SyntheticClip, ...] = (
    SyntheticClip("testsrc_640x360_15fps.mp4", "testsrc2", 640, 360, 15, 4, gop=15),
    SyntheticClip("bars_320x240_5fps.mp4", "smptebars", 320, 240, 5, 4, gop=5),
)

# The valid clip that corrupt_truncated.mp4 is cut from (30 frames before damage).
CORRUPT_SOURCE = SyntheticClip("corrupt_source.mp4", "testsrc2", 320, 240, 15, 2, gop=15)


def ffmpeg_command(clip: SyntheticClip, out: Path, ffmpeg: str = "ffmpeg") -> list[str]:
    """The ffmpeg argv that encodes ``clip`` to ``out``."""
    return [
        ffmpeg, "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
        "-f", "lavfi", "-i", clip.lavfi,
        "-t", str(clip.seconds),
        "-c:v", "libx264", "-preset", "medium", "-crf", str(clip.crf),
        "-pix_fmt", "yuv420p", "-g", str(clip.gop),
        # One encoder thread: x264's output depends on the thread count, which would
        # otherwise follow the machine's core count.
        "-threads", "1",
        # bitexact + no metadata: no encoder version tags or dates in the container.
        "-flags:v", "+bitexact", "-fflags", "+bitexact", "-map_metadata", "-1",
        # moov before mdat: a file cut in its media data still has its index.
        "-movflags", "+faststart",
        "-f", "mp4", str(out),
    ]  # fmt: skip


def encode(clip: SyntheticClip, out: Path, ffmpeg: str = "ffmpeg") -> Path:
    """Encode ``clip`` to ``out`` atomically (a failed run leaves no partial file)."""
    # A plain name, not mkstemp: mkstemp's 0600 mode would stick to the clip.
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        proc = subprocess.run(
            ffmpeg_command(clip, tmp, ffmpeg), capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ffmpeg failed for {out.name}: {proc.stderr.strip()}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def top_level_boxes(data: bytes) -> Iterator[tuple[bytes, int, int, int]]:
    """Yield ``(type, offset, header_size, box_size)`` for each top-level mp4 box."""
    offset = 0
    while offset + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[offset : offset + 8])
        header = 8
        if size == 1:  # 64-bit size follows the type
            (size,) = struct.unpack(">Q", data[offset + 8 : offset + 16])
            header = 16
        elif size == 0:  # box runs to the end of the file
            size = len(data) - offset
        if size < header:
            raise ValueError(f"bad mp4 box {kind!r} at {offset}")
        yield kind, offset, header, size
        offset += size


def corrupt_mp4(data: bytes) -> bytes:
    """Damage a faststart mp4 in its media data, keeping its header intact.

    Inverts 1 KiB a quarter into the ``mdat`` payload and cuts the file halfway
    through it. Both are needed: a cut alone makes PyAV raise only with the default
    single-threaded decoder (frame threading just ends early), the inverted bytes
    make it raise either way.
    """
    boxes = {kind: (off, hdr, size) for kind, off, hdr, size in top_level_boxes(data)}
    if b"moov" not in boxes or b"mdat" not in boxes:
        raise ValueError("not an mp4 with moov and mdat boxes")
    if boxes[b"moov"][0] > boxes[b"mdat"][0]:
        raise ValueError("moov must come before mdat (encode with -movflags +faststart)")
    off, hdr, size = boxes[b"mdat"]
    start, payload = off + hdr, size - hdr
    garble_at, cut_at = start + payload // 4, start + payload // 2
    out = bytearray(data[:cut_at])
    for i in range(garble_at, min(garble_at + 1024, cut_at)):
        out[i] ^= 0xFF  # inversion changes every byte, deterministically
    return bytes(out)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def generate_all(out_dir: Path, ffmpeg: str | None = None) -> list[Path]:
    """Generate every synthetic clip into ``out_dir``; return their paths."""
    exe = ffmpeg or shutil.which("ffmpeg")
    if exe is None:
        raise RuntimeError("ffmpeg not found on PATH (pass --ffmpeg)")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [encode(clip, out_dir / clip.filename, exe) for clip in SYNTHETIC_CLIPS]

    with tempfile.TemporaryDirectory() as tmp:
        source = encode(CORRUPT_SOURCE, Path(tmp) / CORRUPT_SOURCE.filename, exe)
        corrupt = out_dir / CORRUPT_FILENAME
        _write_atomic(corrupt, corrupt_mp4(source.read_bytes()))
    paths.append(corrupt)

    not_a_video = out_dir / NOT_A_VIDEO_FILENAME
    _write_atomic(not_a_video, NOT_A_VIDEO_BYTES)
    paths.append(not_a_video)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m samples.generate", description="Generate synthetic test clips."
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--ffmpeg", default=None, help="ffmpeg executable (default: PATH)")
    args = parser.parse_args(argv)
    try:
        paths = generate_all(args.out, args.ffmpeg)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"{path.stat().st_size:>8} bytes  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
