"""Fixtures the integration tests of more than one module use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streams.outputs.relay import OutputRelay


@pytest.fixture
def relays() -> Iterator[list[OutputRelay]]:
    """Outputs relays a test starts (``test_outputs.relay_of``), stopped after it."""
    made: list[OutputRelay] = []
    yield made
    for relay in made:
        relay.stop(timeout_s=2)
