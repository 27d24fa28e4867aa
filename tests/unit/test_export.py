"""``framebatch export`` without a model: the format registry, argument checks and the class
names it writes, read through the one metadata reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest

from detectors.export import EXPORT_FORMATS, FORMATS, ExportFormat, ExportRequest, metadata
from detectors.metadata import class_names


def test_the_registry_declares_every_format_once() -> None:
    assert FORMATS == tuple(EXPORT_FORMATS) == get_args(ExportFormat)


@pytest.mark.parametrize(
    ("source", "fmt", "target"),
    [
        ("m/yolov8n.pt", "onnx", "m/yolov8n.onnx"),
        ("m/yolov8n.pt", "torchscript", "m/yolov8n.torchscript"),
        ("m/yolov8n.pt", "engine", "m/yolov8n.engine"),
        ("m/yolov8n.onnx", "engine", "m/yolov8n.engine"),
    ],
)
def test_the_default_target_takes_the_format_suffix(source: str, fmt: str, target: str) -> None:
    request = ExportRequest(Path(source), fmt)  # type: ignore[arg-type]
    request.check()
    assert request.target == Path(target)


@pytest.mark.parametrize(
    ("source", "fmt", "message"),
    [
        ("yolov8n.pt", "tflite", r"unknown format 'tflite' \(expected onnx, torchscript, engine\)"),
        ("yolov8n.onnx", "onnx", "cannot export yolov8n.onnx to onnx"),
        ("yolov8n.onnx", "torchscript", "cannot export yolov8n.onnx to torchscript"),
        ("yolov8n.engine", "engine", "cannot export yolov8n.engine to engine"),
    ],
)
def test_unsupported_requests_are_refused(source: str, fmt: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExportRequest(Path(source), fmt).check()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ({0: "person", 1: "bicycle"}, {0: "person", 1: "bicycle"}),  # a checkpoint's dict
        ({1: "bicycle", 0: "person"}, {0: "person", 1: "bicycle"}),  # in any order
        (["person", "bicycle"], {0: "person", 1: "bicycle"}),  # a list
        ("{0: 'person', 1: 'bicycle'}", {0: "person", 1: "bicycle"}),  # ONNX metadata_props
        ('{"0": "person", "1": "bicycle"}', {0: "person", 1: "bicycle"}),  # JSON
        (None, {}),  # nothing stored
    ],
)
def test_exported_names_are_ultralytics_ids(names: object, expected: dict[int, str]) -> None:
    facts = metadata(ExportRequest(Path("yolov8n.pt"), "onnx"), class_names(names), stride=32)
    assert facts["names"] == expected
    # TorchScript's config.txt is JSON (string keys); it reads back to the same labels
    assert class_names(json.loads(json.dumps(facts))["names"]) == tuple(expected.values())
    # ONNX metadata_props hold the Python literal
    assert class_names(str(facts["names"])) == tuple(expected.values())
