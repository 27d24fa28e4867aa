"""Reference pictures read from NAL headers (real H.264 and HEVC packets, demuxed by PyAV):
the packets read as non-reference are exactly the frames FFmpeg's own ``skip_frame=NONREF``
leaves out, whether the packets are length-prefixed (MP4) or carry start codes (MPEG-TS, as
RTSP delivers them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import av
import pytest

from streams.bitstream import reference_test
from tests.conftest import VIDEOS

HIGHWAY = VIDEOS / "highway_traffic_960x540_30fps.mp4"  # H.264 with B-frames, some referenced


def non_reference_packets(path: Path) -> tuple[int, int]:
    """Packets, and those read as non-reference."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        test = reference_test(stream.codec_context.name, stream.codec_context.extradata)
        assert test is not None
        read = [test(packet) for packet in container.demux(stream) if packet.size]
    assert None not in read  # every packet parsed
    return len(read), read.count(False)


def frames_ffmpeg_skips(path: Path) -> int:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONREF"
        out = sum(1 for _ in container.decode(stream))
    with av.open(str(path)) as container:
        return sum(1 for packet in container.demux() if packet.size) - out


def remux(source: Path, target: Path, *codec: str) -> Path:
    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            str(source),
            "-frames:v",
            "120",
            *codec,
            "-an",
            str(target),
        ],
        check=True,
    )
    return target


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bitstream")
    return {
        "h264 mp4": HIGHWAY,
        "h264 annex b": remux(HIGHWAY, folder / "highway.ts", "-c:v", "copy"),
        "hevc mp4": remux(
            HIGHWAY,
            folder / "highway_hevc.mp4",
            "-c:v",
            "libx265",
            "-x265-params",
            "log-level=error:bframes=3:b-pyramid=1",
        ),
        "hevc annex b": remux(
            HIGHWAY,
            folder / "highway_hevc.ts",
            "-c:v",
            "libx265",
            "-x265-params",
            "log-level=error:bframes=3:b-pyramid=1",
        ),
    }


@pytest.mark.parametrize("kind", ["h264 mp4", "h264 annex b", "hevc mp4", "hevc annex b"])
def test_non_reference_packets_are_the_frames_ffmpeg_skips_as_nonref(assets, clips, kind):
    packets, non_reference = non_reference_packets(clips[kind])
    assert non_reference == frames_ffmpeg_skips(clips[kind])
    assert 0 < non_reference < packets  # the clip has both: the test tells them apart


def test_other_codecs_are_not_read():
    assert reference_test("mpeg4", b"") is None


def hevc_unit(kind: int, temporal_id: int, payload: bytes = b"\xaa") -> bytes:
    return b"\x00\x00\x00\x01" + bytes([kind << 1, temporal_id + 1]) + payload


def test_hevc_non_reference_only_on_the_highest_temporal_layer_once_it_is_known():
    """A sub-layer non-reference picture may still be referred to by a higher layer (a
    camera's temporal scalability): it is skipped only on the highest layer, and nothing is
    taken as non-reference before an SPS says how many layers there are."""
    test = reference_test("hevc", b"")  # Annex B: no hvcC
    trail_n = 0
    assert test(hevc_unit(trail_n, 0)) is True  # layers not known yet
    two_layers = b"\x00\x00\x00\x01" + bytes([33 << 1, 1, 0b0000_0010])  # max_sub_layers 2
    test(two_layers)
    assert test(hevc_unit(trail_n, 0)) is True  # layer 1 may refer to it
    assert test(hevc_unit(trail_n, 1)) is False
    assert test(hevc_unit(1, 1)) is True  # TRAIL_R: a reference on any layer
