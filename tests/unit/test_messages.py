"""Wire messages: to_fields -> bytes as Redis stores them -> from_fields, and the JSON contract."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from streams.messages import (
    SCHEMA_VERSION,
    Detection,
    DetectionMessage,
    EndOfStream,
    FrameMessage,
    Timestamps,
    message_kind,
)


def as_redis_stores(fields: Mapping[str, Any]) -> dict[bytes, bytes]:
    """Encode field names and values the way redis-py's ``Encoder.encode`` does for XADD."""

    def encode(value: Any) -> bytes:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, bool):  # redis-py refuses bools
            raise TypeError(f"redis cannot store a bool: {value!r}")
        if isinstance(value, int | float):
            return repr(value).encode()
        if isinstance(value, str):
            return value.encode()
        raise TypeError(f"redis cannot store {type(value).__name__}: {value!r}")

    return {encode(name): encode(value) for name, value in fields.items()}


def frame_message(**changes: Any) -> FrameMessage:
    width, height = changes.pop("input_width", 640), changes.pop("input_height", 640)
    pixels = np.arange(width * height * 3, dtype=np.uint32).astype(np.uint8).tobytes()
    message = FrameMessage(
        camera="cam-1",
        seq=41,
        pts=1.2345678901234567,
        width=1920,
        height=1080,
        scale=1 / 3,
        pad_x=0,
        pad_y=140,
        captured=1_700_000_000.123456,
        enqueued=1_700_000_000.1298765,
        pixels=pixels,
        input_width=width,
        input_height=height,
    )
    return replace(message, **changes)


def detection_message(**changes: Any) -> DetectionMessage:
    message = DetectionMessage(
        camera="lobby",
        seq=7,
        pts=0.28,
        width=1280,
        height=720,
        batch_id=12,
        batch_size=4,
        detections=(
            Detection((10.5, 20.25, 110.0, 220.75), 0.91234, 0, "person"),
            Detection((0.0, 0.0, 1280.0, 720.0), 0.25001, 2, "car"),
        ),
        timestamps=Timestamps(
            captured=1_700_000_000.1,
            enqueued=1_700_000_000.105,
            batched=1_700_000_000.2,
            inferred=1_700_000_000.25,
            published=1_700_000_000.2612345,
        ),
    )
    return replace(message, **changes)


# --- FrameMessage -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"pts": None},
        {"pts": 0.0},  # zero is a time, not "no time"
        {"pts": -0.033366666666666666},  # negative pts happen (B-frame delay)
        {"seq": 0, "camera": "caméra-ü 2"},
        {"scale": 2.0, "pad_x": 288, "pad_y": 0, "width": 100, "height": 1000},
        {"input_width": 320, "input_height": 192},
    ],
)
def test_frame_message_round_trips(changes: dict[str, Any]) -> None:
    message = frame_message(**changes)
    fields = as_redis_stores(message.to_fields())
    assert message_kind(fields) == "frame"
    assert FrameMessage.from_fields(fields) == message


@pytest.mark.parametrize(("width", "height"), [(640, 640), (320, 192), (64, 128)])
def test_frame_image_is_a_read_only_view_of_the_pixels(width: int, height: int) -> None:
    message = frame_message(input_width=width, input_height=height)
    decoded = FrameMessage.from_fields(as_redis_stores(message.to_fields()))
    image = decoded.image()
    assert image.shape == (height, width, 3)
    assert image.dtype == np.uint8
    assert not image.flags.writeable
    assert image.tobytes() == message.pixels
    # HxWx3 row-major: pixel (y, x) channel c is byte (y * width + x) * 3 + c
    y, x = height - 1, width // 2
    assert image[y, x, 2] == message.pixels[(y * width + x) * 3 + 2]


def test_frame_message_without_kind_is_a_frame() -> None:
    fields = as_redis_stores(frame_message().to_fields())
    del fields[b"kind"]
    assert message_kind(fields) == "frame"


# --- EndOfStream --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        EndOfStream("cam-1", 300, "eof"),
        EndOfStream("cam-1", 0, "error", "camera 'cam-1' (rtsp://u:***@h/x): cannot open"),
        EndOfStream("lobby", 12, "stopped", decode_errors=3),
        EndOfStream("lobby", 5, "crashed", "exit code -9 — killed", 1),
        EndOfStream("lobby", -1, "crashed", "decoder process for camera 'lobby' died"),
    ],
)
def test_end_of_stream_round_trips(message: EndOfStream) -> None:
    fields = as_redis_stores(message.to_fields())
    assert message_kind(fields) == "end"
    assert EndOfStream.from_fields(fields) == message


def test_end_of_stream_optional_fields_default() -> None:
    fields = {b"v": b"1", b"kind": b"end", b"camera": b"c", b"frames": b"4", b"reason": b"eof"}
    assert EndOfStream.from_fields(fields) == EndOfStream("c", 4, "eof", "", 0)


# --- DetectionMessage ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"pts": None},
        {"pts": 0.0},
        {"detections": ()},
        {"seq": 123456789, "batch_id": 0, "batch_size": 1},
    ],
)
def test_detection_message_round_trips(changes: dict[str, Any]) -> None:
    message = detection_message(**changes)
    assert DetectionMessage.from_fields(as_redis_stores(message.to_fields())) == message


def test_detection_json_rounds_box_and_score() -> None:
    detection = Detection((1.23456, 2.0, 3.999, 4.005), 0.123456789, 3, "motorcycle")
    assert detection.to_json() == {
        "box": [1.23, 2.0, 4.0, round(4.005, 2)],
        "score": 0.12346,
        "class_id": 3,
        "label": "motorcycle",
        "track_id": None,
    }


def test_a_track_id_round_trips_and_its_absence_reads_as_none() -> None:
    tracked = Detection((1.0, 2.0, 3.0, 4.0), 0.5, 2, "car", track_id=17)
    assert Detection.from_json(tracked.to_json()) == tracked
    written_before = {"box": [1, 2, 3, 4], "score": 0.5, "class_id": 2, "label": "car"}
    assert Detection.from_json(written_before).track_id is None


def test_latency_is_published_minus_captured() -> None:
    assert detection_message().latency_s == pytest.approx(0.1612345)


@pytest.mark.parametrize("pts", [None, 0.28])
def test_detection_to_json_has_the_wire_contract_keys(pts: float | None) -> None:
    message = detection_message(pts=pts)
    line = json.loads(json.dumps(message.to_json()))  # must be plain JSON
    contract = {
        "camera",
        "seq",
        "pts",
        "width",
        "height",
        "batch_size",
        "detections",
        "timestamps",
        "schema",
    }
    assert contract <= set(line)
    assert line["camera"] == "lobby"
    assert line["seq"] == 7
    assert line["pts"] == pts
    assert (line["width"], line["height"]) == (1280, 720)
    assert line["batch_size"] == 4
    assert line["schema"] == SCHEMA_VERSION
    assert set(line["timestamps"]) == {"captured", "enqueued", "batched", "inferred", "published"}
    assert line["timestamps"]["published"] == 1_700_000_000.2612345
    assert len(line["detections"]) == 2
    for detection in line["detections"]:
        assert set(detection) == {"box", "score", "class_id", "label", "track_id"}
        assert len(detection["box"]) == 4
    assert line["detections"][0] == {
        "box": [10.5, 20.25, 110.0, 220.75],
        "score": 0.91234,
        "class_id": 0,
        "label": "person",
        "track_id": None,
    }


# --- schema version -----------------------------------------------------------------------


def _frame_fields() -> dict[bytes, bytes]:
    return as_redis_stores(frame_message().to_fields())


def _end_fields() -> dict[bytes, bytes]:
    return as_redis_stores(EndOfStream("c", 1, "eof").to_fields())


def _detection_fields() -> dict[bytes, bytes]:
    return as_redis_stores(detection_message().to_fields())


@pytest.mark.parametrize(
    ("make_fields", "parse"),
    [
        (_frame_fields, FrameMessage.from_fields),
        (_end_fields, EndOfStream.from_fields),
        (_detection_fields, DetectionMessage.from_fields),
    ],
)
@pytest.mark.parametrize("version", [b"0", b"2", b"99", None])
def test_schema_version_mismatch_raises(make_fields, parse, version: bytes | None) -> None:
    fields = make_fields()
    assert fields[b"v"] == str(SCHEMA_VERSION).encode()
    if version is None:
        del fields[b"v"]  # a message from before versioning
    else:
        fields[b"v"] = version
    with pytest.raises(ValueError, match="schema version"):
        parse(fields)


def test_detection_message_with_another_schema_is_refused_on_read() -> None:
    fields = as_redis_stores(detection_message(schema=SCHEMA_VERSION + 1).to_fields())
    with pytest.raises(ValueError, match="schema version"):
        DetectionMessage.from_fields(fields)
