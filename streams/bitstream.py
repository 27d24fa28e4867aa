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
HEVC_SPS = 33

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


class _HevcReferences:
    """A sub-layer non-reference picture (even VCL types up to 14) is referenced by nothing at
    its temporal layer or below: by nothing at all when it is on the stream's highest layer
    (a camera's stream has one).  The number of layers comes from ``hvcC`` or from an SPS
    seen in the stream; until it is known, every picture is taken as a reference."""

    def __init__(self, layers: int | None):
        self.layers = layers or None  # 0 in hvcC: not known

    def __call__(self, units: Iterator[bytes]) -> bool | None:
        seen = False
        for unit in units:
            if len(unit) < 3:
                continue
            kind, temporal_id = unit[0] >> 1 & 0x3F, (unit[1] & 7) - 1
            if kind == HEVC_SPS:
                self.layers = (unit[2] >> 1 & 7) + 1  # sps_max_sub_layers_minus1
            elif kind in HEVC_VCL_TYPES:
                non_reference = kind <= HEVC_SUB_LAYER_NON_REFERENCE_MAX and not kind % 2
                if not non_reference or self.layers is None or temporal_id != self.layers - 1:
                    return True
                seen = True
        return False if seen else None


def reference_test(codec: str, extradata: bytes | None) -> ReferenceTest | None:
    """A test for the stream's packets, or None where the codec's headers are not read here."""
    extradata = extradata or b""
    if codec == "h264":
        read: Callable[[Iterator[bytes]], bool | None] = _h264_reference
        length_prefixed = extradata[:1] == b"\x01" and len(extradata) > 4  # avcC
        size_at = 4  # lengthSizeMinusOne in byte 4
    elif codec == "hevc":
        # hvcC, as FFmpeg tells it from Annex B (some writers put 0 in its version byte)
        hvcc = len(extradata) > 22 and (extradata[0] or extradata[1] or extradata[2] > 1)
        read = _HevcReferences((extradata[21] >> 3 & 7) if hvcc else None)  # numTemporalLayers
        length_prefixed, size_at = bool(hvcc), 21  # lengthSizeMinusOne in byte 21
    else:
        return None
    if length_prefixed:
        size = (extradata[size_at] & 3) + 1

        def length_prefixed_packet(packet: bytes | memoryview) -> bool | None:
            return read(_length_prefixed_units(bytes(packet), size))

        return length_prefixed_packet

    def annex_b(packet: bytes | memoryview) -> bool | None:
        return read(_annex_b_units(bytes(packet)))

    return annex_b
