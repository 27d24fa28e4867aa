"""The decode-kill benchmark runs end to end (real decode workers and Redis): with a lease TTL
of a minute, the killed worker's cameras move in seconds only through its last will, so the
tool's figure says the will was left, not how fast (that is docs/benchmarks.md's)."""

from __future__ import annotations

import re

import pytest

from framebatch_tools.bench import decode_kill

pytestmark = pytest.mark.integration


def test_a_killed_decode_workers_cameras_are_taken_before_their_ttl(capsys):
    assert decode_kill.main(["--cameras", "4", "--ttl", "60", "--rounds", "1"]) == 0
    printed = capsys.readouterr().out
    taken = float(re.search(r"round 1: .* taken in ([0-9.]+) s", printed).group(1))
    assert taken < 30, printed  # the leases themselves would hold the cameras 60 s
