"""A sampled camera's decode cost, every frame against what ``auto`` decodes:
``python -m framebatch_tools.bench.decode [--gop 30] [--max-fps 0.5] [--rounds 5]``.

The 540p highway clip looped three times, re-encoded as a camera's sub-stream would send it
(H.264, a key frame every ``--gop`` frames, no B-frames), or as it is with ``--gop 0`` (a key
frame every 3 s, B-frames), decoded by :class:`streams.sources.VideoSource` with the sampler of
a camera at ``--max-fps``: once with ``decode_frames: all`` and once with ``auto`` (key frames
only once the GOP is measured and fits in the sampling period, else what the frames taken
need), alternating, one decode thread each (the decoders' setting when every core is busy).
Measured: CPU seconds of this process per second of video, and the frames taken.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from streams.sampling import DecodeGate, FrameSampler
from streams.sources import VideoSource

CLIP = (
    Path(__file__).resolve().parents[3] / "shared/assets/videos/highway_traffic_960x540_30fps.mp4"
)


def encode(source: Path, target: Path, gop: int) -> None:
    """Looped three times; re-encoded with a ``gop``-frame GOP, or copied as it is (0)."""
    codec = ["-c:v", "copy"] if gop == 0 else ["-c:v", "libx264", "-g", str(gop)]
    if gop:
        codec += ["-keyint_min", str(gop), "-sc_threshold", "0", "-bf", "0"]
    subprocess.run(
        ["ffmpeg", "-v", "error", "-stream_loop", "2", "-i", str(source), *codec, "-an"]
        + [str(target)],
        check=True,
    )


def decode(clip: Path, mode: str, max_fps: float) -> tuple[float, list[float], int, int]:
    """CPU seconds, the pts of the frames taken, packets decoded, packets skipped."""
    sampler = FrameSampler(max_fps=max_fps)
    gate = DecodeGate(mode, max_fps=max_fps, sampler=sampler)  # type: ignore[arg-type]
    taken = []
    started = time.process_time()
    with VideoSource("bench", str(clip), decode_threads=1) as source:
        for frame in source.frames(gate):
            if sampler.take(frame.pts or 0.0):
                frame.image  # noqa: B018 (converted, as a frame taken is)
                taken.append(frame.pts)
        packets, skipped = source.packets, source.skipped
    return time.process_time() - started, taken, packets, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gop", type=int, default=30, metavar="N", help="frames per GOP (0: the clip's own)"
    )
    parser.add_argument("--max-fps", type=float, default=0.5, metavar="N", help="sampling")
    parser.add_argument("--rounds", type=int, default=5, metavar="N", help="rounds, alternated")
    parser.add_argument("--clip", type=Path, default=CLIP, metavar="PATH", help="source clip")
    args = parser.parse_args()
    with TemporaryDirectory() as folder:
        clip = Path(folder) / f"gop{args.gop}.mp4"
        encode(args.clip, clip, args.gop)
        seconds = {}
        runs: dict[str, list[float]] = {"all": [], "auto": []}
        for index in range(args.rounds):
            order = ("all", "auto") if index % 2 == 0 else ("auto", "all")
            for mode in order:
                cpu, taken, packets, skipped = decode(clip, mode, args.max_fps)
                runs[mode].append(cpu)
                seconds[mode] = (taken, packets, skipped)
    (taken_all, packets_all, _), (taken_auto, packets_auto, skipped) = (
        seconds["all"],
        seconds["auto"],
    )
    # key frames only: each frame taken is the first key frame at or after its due time
    late = [b - a for a, b in zip(taken_all, taken_auto, strict=False)]
    video_s = (packets_all) / 30.0
    result = {
        "gop": args.gop,
        "max_fps": args.max_fps,
        "video_s": round(video_s, 1),
        "frames_taken": {"all": len(taken_all), "auto": len(taken_auto)},
        "same_frames_taken": sum(1 for d in late if abs(d) < 1e-6),
        "latest_by_s": round(max(late, default=0.0), 3),
        "decoded": {"all": packets_all, "auto": packets_auto},
        "never_decoded_auto": skipped,
        "cpu_ms_per_video_s": {
            mode: round(1000 * statistics.median(cpu) / video_s, 2) for mode, cpu in runs.items()
        },
    }
    result["ratio_auto_to_all"] = round(
        statistics.median(runs["auto"]) / statistics.median(runs["all"]), 3
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
