"""The camera's request-body schema as the API publishes it."""

from __future__ import annotations

import json

import jsonschema

from pipeline.serve.http.models import camera_schema


def test_the_camera_schema_stands_alone_inside_an_openapi_document():
    """A body schema's ``#/$defs/...`` would point into the OpenAPI document, where nothing is:
    clients (and the fuzzer) could not build a camera with analytics."""
    text = json.dumps(camera_schema())
    assert "$ref" not in text and "$defs" not in text
    assert "zones" in text and "tracker" in text


def test_a_camera_with_analytics_is_valid_and_a_bad_zone_is_not():
    validator = jsonschema.Draft202012Validator(camera_schema())
    camera = {
        "id": "gate",
        "url": "rtsp://127.0.0.1:8554/gate",
        "analytics": {
            "tracker": {},
            "zones": {"bay": {"polygon": [[0, 0], [10, 0], [10, 10]]}},
            "lines": {"door": {"start": [0, 5], "end": [10, 5]}},
        },
    }
    validator.validate(camera)
    camera["analytics"]["zones"]["bay"]["polygon"] = "everywhere"
    assert not validator.is_valid(camera)
