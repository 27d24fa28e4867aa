"""Whether an H.264 or HEVC packet holds a reference picture, read from its NAL unit headers
before it is decoded (what FFmpeg's ``skip_frame=NONREF`` reads, one packet at a time, so a
packet never decoded is counted as one).

Packets come length-prefixed from MP4 (``avcC``/``hvcC`` extradata says the prefix's size) or
with Annex B start codes from RTSP and MPEG-TS.  Any other codec, or a packet that does not
parse, is taken as a reference: decoding it costs time, skipping a reference costs frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

H264_SLICE_TYPES = (1, 5)  # coded slice of a non-IDR / IDR picture
HEVC_VCL_TYPES = range(32)
HEVC_SUB_LAYER_NON_REFERENCE_MAX = 14  # TRAIL_N .. RSV_VCL_N14: even types are not referenced

ReferenceTest = Callable[[bytes | memoryview], "bool | None"]  # a packet (buffer protocol)


def _annex_b_units(data: bytes) -> Iterator[bytes]:
    """NAL units between start codes (00 00 01, or 00 00 00 01)."""
    start = data.find(b"\x00\x00\x01")
    while start >= 0:
        start += 3
        end = data.find(b"\x00\x00\x01", start)
        yield data[start : end if end >= 0 else len(data)]
        start = end


def _length_prefixed_units(data: bytes, size: int) -> Iterator[bytes]:
    position = 0
    while position + size < len(data):
        length = int.from_bytes(data[position : position + size], "big")
        position += size
        yield data[position : position + length]
        position += length


def _h264_reference(units: Iterator[bytes]) -> bool | None:
    """A picture is a reference when any of its slices has a non-zero ``nal_ref_idc``."""
    seen = False
    for unit in units:
        if unit and unit[0] & 0x1F in H264_SLICE_TYPES:
            if unit[0] >> 5 & 3:
                return True
            seen = True
    return False if seen else None


def _hevc_reference(units: Iterator[bytes]) -> bool | None:
    """Sub-layer non-reference pictures (even VCL types up to 14) are referenced by nothing
    at their temporal layer or below; a camera's stream has one layer."""
    seen = False
    for unit in units:
        if len(unit) < 2:
            continue
        kind = unit[0] >> 1 & 0x3F
        if kind in HEVC_VCL_TYPES:
            if kind > HEVC_SUB_LAYER_NON_REFERENCE_MAX or kind % 2:
                return True
            seen = True
    return False if seen else None


def reference_test(codec: str, extradata: bytes | None) -> ReferenceTest | None:
    """A test for the stream's packets, or None where the codec's headers are not read here."""
    if codec == "h264":
        read, prefix_at = _h264_reference, 4  # avcC: lengthSizeMinusOne in byte 4
    elif codec == "hevc":
        read, prefix_at = _hevc_reference, 21  # hvcC: lengthSizeMinusOne in byte 21
    else:
        return None
    extradata = extradata or b""
    if extradata[:1] == b"\x01" and len(extradata) > prefix_at:
        size = (extradata[prefix_at] & 3) + 1

        def length_prefixed(packet: bytes | memoryview) -> bool | None:
            return read(_length_prefixed_units(bytes(packet), size))

        return length_prefixed

    def annex_b(packet: bytes | memoryview) -> bool | None:
        return read(_annex_b_units(bytes(packet)))

    return annex_b
