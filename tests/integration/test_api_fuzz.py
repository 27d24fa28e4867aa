"""The HTTP API fuzzed from its own OpenAPI document against a running daemon: whatever a
client sends, no 5xx.

Cameras the fuzzer adds are opened by real decoder processes, so every camera URL it makes up
is replaced before sending: a file that does not exist, an RTSP port of this machine where
nothing listens, or a URL the config refuses. No request or decoder leaves 127.0.0.1, and at
most ``CAMERA_BUDGET`` camera ids are ever added (each one is a decoder process).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from streams.embedded_redis import free_tcp_port
from tests.conftest import VIDEOS
from tests.integration.test_live_view import Daemon, looping_config, running_daemon

pytestmark = pytest.mark.integration

CLIP = VIDEOS / "indoor_person_768x432_10fps.mp4"
MAX_EXAMPLES = 30  # per operation and mode (valid input, invalid input)
CAMERA_BUDGET = 6  # camera ids the fuzzer may add, however many bodies it sends
REQUEST_TIMEOUT_S = 20  # changes wait for the supervisor's tick; a hang is a failure too
# not positive_data_acceptance: the URLs are rewritten, and a config's validators check more
# than JSON Schema says (loop only for files, max_backlog <= redis.frames_maxlen...)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def daemon(assets, redis_url, tmp_path_factory) -> Iterator[Daemon]:
    config = looping_config(
        tmp_path_factory.mktemp("fuzz") / "fuzz.yaml", redis_url, {"lobby": CLIP}
    )
    with running_daemon(config) as running:
        yield running


@pytest.fixture(scope="module")
def api_schema(daemon: Daemon) -> schemathesis.BaseSchema:
    # an explicit config: no schemathesis.toml of the machine's changes what runs
    config = schemathesis.Config.from_dict({"seed": 20240601})
    return schemathesis.openapi.from_url(f"{daemon.url}/openapi.json", config=config, timeout=10)


def checksum(text: str) -> int:
    """Of a generated string (lone surrogates included): the same choice on every run."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


class Confine:
    """Rewrites what the fuzzer generated for ``POST /api/cameras`` so that nothing it adds
    reaches outside this machine, and the number of cameras stays bounded."""

    def __init__(self, missing_dir: Path):
        self._urls = (
            lambda n: str(missing_dir / f"missing-{n}.mp4"),  # the decoder fails to open it
            lambda n: f"rtsp://127.0.0.1:{free_tcp_port()}/fuzz-{n}",  # connection refused
            lambda n: f"htp://127.0.0.1/fuzz-{n}",  # refused by validation (a 422)
            lambda _n: "",  # refused by validation
        )
        self.added: list[str] = []

    def __call__(self, case: schemathesis.Case) -> None:
        body = case.body
        if case.method.upper() != "POST" or not isinstance(body, dict):
            return
        if isinstance(body.get("url"), str):
            n = checksum(body["url"])
            body["url"] = self._urls[n % len(self._urls)](n)
        camera = body.get("id")
        if isinstance(camera, str) and camera not in self.added:
            if len(self.added) >= CAMERA_BUDGET:  # one added before: in use (409) or re-added
                body["id"] = self.added[checksum(camera) % CAMERA_BUDGET]

    def note(self, case: schemathesis.Case, status: int) -> None:
        if case.method.upper() == "POST" and status == 201:
            camera = case.body["id"]
            if camera not in self.added:
                self.added.append(camera)


@pytest.fixture(scope="module")
def confine(tmp_path_factory) -> Confine:
    return Confine(tmp_path_factory.mktemp("missing"))


def operations(api_schema: schemathesis.BaseSchema) -> list[schemathesis.APIOperation]:
    return [result.ok() for result in api_schema.get_all_operations()]


def has_input(operation: schemathesis.APIOperation) -> bool:
    return any(True for _ in operation.iter_parameters()) or bool(list(operation.body))


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
def test_no_request_makes_a_server_error(api_schema, confine: Confine, subtests, mode):
    """Every operation of the document, with valid (positive) or invalid (negative) input:
    never a 5xx, and every answer as documented (status, media type, body)."""
    for operation in operations(api_schema):
        if mode is schemathesis.GenerationMode.NEGATIVE and not has_input(operation):
            continue  # nothing to make invalid

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,  # the same requests every run
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: schemathesis.Case) -> None:
            confine(case)
            response = case.call(timeout=REQUEST_TIMEOUT_S)
            confine.note(case, response.status_code)
            case.validate_response(response, checks=CHECKS)

        with subtests.test(msg=operation.label):
            fuzz()
    if mode is schemathesis.GenerationMode.POSITIVE:
        assert confine.added, "no camera was added: the add path went untested"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/cameras", "[" * 20_000 + "]" * 20_000),  # deeper than json can parse
        (
            "POST",
            "/api/cameras",
            '{"id": "deep", "url": "x.mp4", "fps": ' + "[" * 900 + "]" * 900 + "}",
        ),
        # under the 64 KiB cap (a larger body is refused before it is parsed)
        ("PATCH", "/api/cameras/lobby", '{"priority": ' + "[" * 30_000 + "]" * 30_000 + "}"),
        ("POST", "/api/cameras", b"\xff\xfe{"),  # not UTF-8
    ],
    ids=["nested-body", "nested-field", "nested-patch", "not-utf8"],
)
def test_a_body_no_parser_takes_is_a_4xx(daemon: Daemon, method, path, body):
    with httpx.Client(base_url=daemon.url, timeout=REQUEST_TIMEOUT_S) as client:
        response = client.request(
            method, path, content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code in (400, 422), response.text
    assert "detail" in response.json()


def test_a_body_larger_than_any_camera_is_refused(daemon: Daemon):
    with httpx.Client(base_url=daemon.url, timeout=REQUEST_TIMEOUT_S) as client:
        body = '{"id": "big", "url": "' + "x" * 100_000 + '.mp4"}'
        response = client.post(
            "/api/cameras", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413 and "64 KiB" in response.json()["detail"]
