"""The ``transport:`` config section: defaults, valid values, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pipeline.config import Config, TransportConfig, parse_config
from pipeline.supervisor.builders import transport_spec
from tests.unit.test_config import BASE, MINIMAL, merged, parse_errors


def with_transport(**fields: Any) -> dict[str, Any]:
    return merged(MINIMAL, {"transport": fields})


def test_default_is_auto() -> None:
    transport = parse_config(MINIMAL, base_dir=BASE).transport
    assert (transport.kind, transport.jpeg_quality, transport.shm_slots) == ("auto", 90, None)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"kind": "jpeg"}, ("jpeg", 90, None)),
        ({"kind": "jpeg", "jpeg_quality": 1}, ("jpeg", 1, None)),
        ({"kind": "jpeg", "jpeg_quality": 100}, ("jpeg", 100, None)),
        ({"kind": "shm"}, ("shm", 90, None)),
        ({"kind": "shm", "shm_slots": 65}, ("shm", 90, 65)),
        ({"kind": "raw"}, ("raw", 90, None)),
    ],
)
def test_valid_transport(fields: dict[str, Any], expected: tuple) -> None:
    transport = parse_config(with_transport(**fields), base_dir=BASE).transport
    assert (transport.kind, transport.jpeg_quality, transport.shm_slots) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (with_transport(kind="png"), "transport.kind: must be 'auto', 'raw', 'jpeg' or 'shm'"),
        (with_transport(jpeg_quality=0), "transport.jpeg_quality: must be >= 1 (got 0)"),
        (with_transport(jpeg_quality=101), "transport.jpeg_quality: must be <= 100 (got 101)"),
        (with_transport(jpeg_quality="high"), "transport.jpeg_quality: must be an integer"),
        (with_transport(shm_slots=1), "transport.shm_slots: must be >= 2 (got 1)"),
        (
            with_transport(kind="shm", shm_slots=64),
            "transport.shm_slots: must be more than redis.frames_maxlen (64), or frames are "
            "overwritten before the batcher reads them",
        ),
        (
            merged(with_transport(shm_slots=20), {"redis": {"frames_maxlen": 20}}),
            "transport.shm_slots: must be more than redis.frames_maxlen (20), or frames are "
            "overwritten before the batcher reads them",
        ),
        (
            with_transport(knd="shm"),
            "transport: unknown key 'knd'; did you mean 'kind'?",
        ),
        (merged(MINIMAL, {"transport": "shm"}), "transport: must be a mapping (got string)"),
    ],
)
def test_invalid_transport(data: dict[str, Any], expected: str) -> None:
    errors = parse_errors(data)
    assert any(line.startswith(expected) for line in errors), errors


def test_section_is_frozen_described_and_strict() -> None:
    assert TransportConfig.model_config.get("extra") == "forbid"
    assert TransportConfig.model_config.get("frozen") is True
    assert [n for n, f in TransportConfig.model_fields.items() if not f.description] == []
    assert Config.model_fields["transport"].description
    config = parse_config(with_transport(kind="shm"), base_dir=BASE)
    with pytest.raises(ValidationError):
        config.transport.kind = "raw"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("patch", "slots"),
    [
        ({}, 64 + 32 + 16),  # the backlog + 4 x max batch (the batching queue) + trim slack
        ({"batching": {"max_batch_size": 16, "max_queue_frames": 40}}, 64 + 40 + 16),
        ({"redis": {"frames_maxlen": 16}}, 16 + 32 + 16),
        ({"transport": {"shm_slots": 300}}, 300),
    ],
)
def test_ring_size_the_daemon_gives_decoders(patch: dict[str, Any], slots: int) -> None:
    config = parse_config(merged(with_transport(kind="shm"), patch), base_dir=BASE)
    spec = transport_spec(config)
    assert spec.kind == "shm" and spec.ring_slots(config.redis.frames_maxlen) == slots
