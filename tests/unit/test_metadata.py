"""The one model-metadata reader: the values each format stores, read to the same facts."""

from __future__ import annotations

import pytest

from detectors.metadata import class_names, imgsz


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ()),
        (["a", "b"], ("a", "b")),  # a checkpoint's list
        ({"1": "b", "0": "a"}, ("a", "b")),  # an engine's JSON header: keys are strings
        ({0: "a", 1: "b"}, ("a", "b")),  # a checkpoint's dict
        ("{0: 'a', 1: 'b'}", ("a", "b")),  # ONNX metadata_props: a Python literal
        ('{"0": "a", "1": "b"}', ("a", "b")),  # TorchScript config.txt: JSON
    ],
)
def test_class_names_from_every_format(value: object, expected: tuple[str, ...]) -> None:
    assert class_names(value) == expected


def test_absent_names_are_numbers_when_the_class_count_is_known() -> None:
    assert class_names(None, 3) == ("0", "1", "2")
    assert class_names({}, 2) == ("0", "1")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"0": "a", "2": "c"}, "must number the classes 0..1"),
        ("{0: 'a',", "not a readable literal"),
        (7, "must be a list or an object, got int"),
    ],
)
def test_unreadable_names_are_an_error(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        class_names(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (640, (640, 640)), ([384, 640], (384, 640)), ("(320, 320)", (320, 320))],
)
def test_imgsz(value: object, expected: tuple[int, int] | None) -> None:
    assert imgsz(value) == expected
