"""Shorter copies of the shared clips for tests: their first GOPs, stream-copied.

Each cut ends before a keyframe, so its frames decode exactly as the same frames of the whole
clip do (the clips' GOPs are closed: ``same_first_frames`` checks it), and it stays real
H.264 decoded by PyAV like the others."""

from __future__ import annotations

import hashlib
from pathlib import Path

import av


def cut_clip(source: Path, target: Path, at_least: int) -> int:
    """Writes ``source``'s first packets to ``target``, up to the first keyframe at or after
    packet ``at_least`` (or the end); returns how many frames the cut has."""
    with av.open(str(source)) as inp, av.open(str(target), "w") as out:
        stream = inp.streams.video[0]
        copy = out.add_stream_from_template(stream)
        muxed = 0
        for packet in inp.demux(stream):
            if packet.dts is None:  # the demuxer's flush packet
                continue
            if muxed >= at_least and packet.is_keyframe:
                break
            packet.stream = copy
            out.mux(packet)
            muxed += 1
    return muxed


def frame_digests(path: Path, count: int | None = None) -> list[str]:
    """The first ``count`` decoded frames' pixel digests (all frames: ``None``)."""
    digests = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            if count is not None and len(digests) == count:
                break
            digests.append(hashlib.sha256(frame.to_ndarray(format="bgr24").tobytes()).hexdigest())
    return digests


def same_first_frames(cut: Path, whole: Path) -> bool:
    """Whether every frame of ``cut`` decodes to the pixels of the same frame of ``whole``."""
    mine = frame_digests(cut)
    return mine == frame_digests(whole, len(mine))
