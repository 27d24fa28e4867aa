"""Engine files: Ultralytics' metadata header byte for byte, plain engines, sidecars, damage."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from detectors.tensorrt.engine_file import (
    EngineFileError,
    encode_header,
    read_engine_file,
    sidecar_candidates,
    write_engine_file,
)

# Stand-in for a serialized engine: TensorRT plans open with a magic tag, never with "{".
ENGINE = b"ftrt\x00\x00\x00\x00" + bytes(range(256)) * 4

# What Ultralytics 8.4 puts in ``self.metadata`` for a dynamic-batch FP16 engine export
# (names keys become strings in JSON; imgsz is [height, width]).
ULTRALYTICS_METADATA = {
    "description": "Ultralytics YOLOv8n model trained on coco.yaml",
    "author": "Ultralytics",
    "date": "2026-01-01T00:00:00+00:00",
    "version": "8.4.190",
    "license": "AGPL-3.0 License (https://ultralytics.com/license)",
    "docs": "https://docs.ultralytics.com",
    "stride": 32,
    "task": "detect",
    "batch": 16,
    "imgsz": [640, 640],
    "names": {"0": "person", "1": "bicycle", "2": "car"},
    "args": {"batch": 16, "half": True, "int8": False, "dynamic": True, "nms": False},
    "channels": 3,
}


def ultralytics_file(path: Path, metadata: dict, engine: bytes = ENGINE) -> Path:
    """The file Ultralytics' ``onnx2engine`` writes, built by hand from its source."""
    meta = json.dumps(metadata)
    path.write_bytes(len(meta).to_bytes(4, byteorder="little", signed=True) + meta.encode())
    with path.open("ab") as handle:
        handle.write(engine)
    return path


def test_round_trip(tmp_path: Path) -> None:
    metadata = {
        "names": ["person", "car"],
        "imgsz": [384, 640],
        "framebatch": {
            "min_batch": 1,
            "opt_batch": 8,
            "max_batch": 32,
            "half": True,
            "int8": False,
        },
    }
    written = write_engine_file(tmp_path / "m.engine", ENGINE, metadata)
    read = read_engine_file(tmp_path / "m.engine")
    assert read == written
    assert read.has_header and read.sidecar is None
    assert read.metadata == metadata
    assert read.read_engine() == ENGINE
    assert read.engine_offset == len(encode_header(metadata))
    assert read.engine_size == len(ENGINE)
    assert read.class_names == ("person", "car")
    assert read.imgsz == (384, 640)
    assert (read.min_batch, read.opt_batch, read.max_batch) == (1, 8, 32)
    assert (read.half, read.int8) == (True, False)


def test_writes_ultralytics_layout_byte_for_byte(tmp_path: Path) -> None:
    ours = write_engine_file(tmp_path / "ours.engine", ENGINE, ULTRALYTICS_METADATA)
    theirs = ultralytics_file(tmp_path / "theirs.engine", ULTRALYTICS_METADATA)
    assert ours.path.read_bytes() == theirs.read_bytes()
    raw = ours.path.read_bytes()
    (length,) = struct.unpack("<i", raw[:4])
    assert json.loads(raw[4 : 4 + length]) == ULTRALYTICS_METADATA
    assert raw[4 + length :] == ENGINE


def test_reads_ultralytics_engine(tmp_path: Path) -> None:
    read = read_engine_file(ultralytics_file(tmp_path / "yolo.engine", ULTRALYTICS_METADATA))
    assert read.has_header
    assert read.read_engine() == ENGINE
    assert read.class_names == ("person", "bicycle", "car")
    assert read.imgsz == (640, 640)
    # Ultralytics' dynamic profile is 1..batch; its opt is not in the metadata.
    assert (read.min_batch, read.opt_batch, read.max_batch) == (1, None, 16)
    assert (read.half, read.int8) == (True, False)


def test_reads_newer_ultralytics_quantize_argument(tmp_path: Path) -> None:
    metadata = dict(ULTRALYTICS_METADATA, batch=1, args={"batch": 1, "quantize": 8})
    read = read_engine_file(ultralytics_file(tmp_path / "q.engine", metadata))
    assert (read.half, read.int8) == (False, True)
    assert (read.min_batch, read.opt_batch, read.max_batch) == (1, 1, 1)  # static batch


def test_plain_engine_without_header(tmp_path: Path) -> None:
    path = tmp_path / "plain.engine"
    path.write_bytes(ENGINE)
    read = read_engine_file(path)
    assert not read.has_header
    assert read.engine_offset == 0
    assert read.read_engine() == ENGINE
    assert read.metadata == {}
    assert read.class_names == ()
    assert read.imgsz is None
    assert (read.min_batch, read.opt_batch, read.max_batch, read.half) == (None,) * 4


def test_write_plain_engine(tmp_path: Path) -> None:
    read = write_engine_file(tmp_path / "plain.engine", ENGINE, None)
    assert read.path.read_bytes() == ENGINE
    assert not read.has_header


@pytest.mark.parametrize("name_style", ["full", "stem"])
def test_sidecar_supplies_facts_for_a_plain_engine(tmp_path: Path, name_style: str) -> None:
    path = tmp_path / "trtexec.engine"
    path.write_bytes(ENGINE)
    full, stem = sidecar_candidates(path)
    sidecar = full if name_style == "full" else stem
    sidecar.write_text(
        json.dumps({"names": ["a", "b"], "imgsz": 320, "min_batch": 1, "max_batch": 8})
    )
    read = read_engine_file(path)
    assert read.sidecar == sidecar
    assert not read.has_header
    assert read.class_names == ("a", "b")
    assert read.imgsz == (320, 320)
    assert (read.min_batch, read.opt_batch, read.max_batch) == (1, None, 8)


def test_sidecar_overrides_header_keys(tmp_path: Path) -> None:
    path = ultralytics_file(tmp_path / "m.engine", ULTRALYTICS_METADATA)
    sidecar_candidates(path)[0].write_text(json.dumps({"names": ["only"]}))
    read = read_engine_file(path)
    assert read.has_header
    assert read.class_names == ("only",)
    assert read.imgsz == (640, 640)  # the header's other keys stay


def test_onnx_style_literal_strings(tmp_path: Path) -> None:
    """Values copied from an ONNX model's metadata_props are Python literals in strings."""
    metadata = {
        "names": "{0: 'person', 1: 'car'}",
        "imgsz": "[640, 640]",
        "batch": "4",
        "args": "{'batch': 4, 'half': False, 'int8': False, 'dynamic': False}",
    }
    read = write_engine_file(tmp_path / "m.engine", ENGINE, metadata)
    assert read.class_names == ("person", "car")
    assert read.imgsz == (640, 640)
    assert (read.min_batch, read.opt_batch, read.max_batch) == (4, 4, 4)
    assert (read.half, read.int8) == (False, False)


def corrupt_cases() -> list[tuple[str, bytes, str]]:
    good = json.dumps({"names": ["a"]}).encode()
    bad = b"{not json}"

    def header(length: int, payload: bytes) -> bytes:
        return struct.pack("<i", length) + payload

    return [
        ("bad-json", header(len(bad), bad) + ENGINE, "not valid JSON"),
        ("trailing-data", header(5, b"{}{}x") + ENGINE, "not valid JSON"),
        ("bad-utf8", header(4, b"{\xff\xfe}") + ENGINE, "not valid JSON"),
        ("length-past-end", header(10_000_000, good) + ENGINE, "claims 10000000 bytes"),
        ("negative-length", header(-5, good) + ENGINE, "claims -5 bytes"),
        ("truncated-json", header(len(good), good[:-3]), "truncated or damaged"),
        ("header-only", header(len(good), good), "no engine after it"),
        ("tiny", b"\x01\x02", "too small"),
    ]


@pytest.mark.parametrize(("name", "raw", "message"), corrupt_cases())
def test_corrupt_header_names_the_file(tmp_path: Path, name: str, raw: bytes, message: str) -> None:
    path = tmp_path / f"{name}.engine"
    path.write_bytes(raw)
    with pytest.raises(EngineFileError) as caught:
        read_engine_file(path)
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


def test_malformed_field_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.engine"
    write_engine_file(path, ENGINE, {"names": ["a"]})
    sidecar = sidecar_candidates(path)[0]
    sidecar.write_text(json.dumps({"imgsz": [1, 2, 3]}))
    with pytest.raises(EngineFileError, match="imgsz") as caught:
        read_engine_file(path)
    assert str(sidecar) in str(caught.value)


def test_sidecar_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "m.engine"
    path.write_bytes(ENGINE)
    sidecar_candidates(path)[1].write_text("names: [a]")
    with pytest.raises(EngineFileError, match="m.json"):
        read_engine_file(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.engine"):
        read_engine_file(tmp_path / "nope.engine")


def test_write_is_atomic_and_refuses_empty(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "m.engine"
    with pytest.raises(EngineFileError, match="empty"):
        write_engine_file(path, b"", {"names": []})
    assert not path.exists()
    write_engine_file(path, memoryview(ENGINE), {"names": ["x"]})
    assert [p.name for p in path.parent.iterdir()] == ["m.engine"]  # no partial file left


@pytest.mark.parametrize(
    ("metadata", "any_size"),
    [
        (ULTRALYTICS_METADATA, True),  # dynamic=True: 32x32 up to 2x imgsz in H and W
        ({**ULTRALYTICS_METADATA, "args": {"batch": 1, "dynamic": False}}, False),
        # ours says it outright; args.dynamic may mean a batch range only
        ({"imgsz": [640, 640], "args": {"dynamic": True}, "framebatch": {"rect": False}}, False),
        ({"imgsz": [640, 640], "args": {"dynamic": True}, "framebatch": {"rect": True}}, True),
        ({"imgsz": [640, 640], "args": {"dynamic": True}, "framebatch": {"max_batch": 8}}, False),
    ],
)
def test_whether_the_engine_takes_any_height_and_width(
    tmp_path: Path, metadata: dict, any_size: bool
) -> None:
    read = read_engine_file(ultralytics_file(tmp_path / "m.engine", metadata))
    assert read.any_size is any_size
