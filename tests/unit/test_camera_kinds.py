"""One word for one idea: a *live* camera is a network stream; a file replayed at its frame rate
(``realtime: true``, the demo's cameras) is a real-time replay, not live. The API says both."""

from __future__ import annotations

import pytest

from pipeline.config import CameraConfig
from pipeline.serve.control import CameraStates
from pipeline.serve.http.models import CameraOut


@pytest.mark.parametrize(
    ("entry", "live", "realtime"),
    [
        ({"url": "rtsp://cam.local/1"}, True, True),  # a live camera comes at its own pace
        ({"url": "rtsps://cam.local/1", "realtime": False}, True, True),  # whatever is set
        ({"url": "/clips/a.mp4", "realtime": True, "loop": True}, False, True),  # the demo's
        ({"url": "/clips/a.mp4", "realtime": False}, False, False),
        ({"url": "/clips/a.mp4"}, False, False),  # realtime unset: as fast as it is detected
    ],
    ids=["rtsp", "rtsps-realtime-false", "replay", "file", "file-default"],
)
def test_the_api_tells_live_cameras_from_real_time_replays(entry, live, realtime):
    camera = CameraConfig(id="cam", **entry)
    states = CameraStates()
    states.add(camera.id, camera.url, camera.priority, camera.is_live, camera.realtime)
    [view] = states.views({})
    assert (view.live, view.realtime) == (live, realtime)
    out = CameraOut.model_validate(view, from_attributes=True)
    assert (out.live, out.realtime) == (live, realtime)


def test_both_words_are_documented_in_the_api_schema():
    fields = CameraOut.model_json_schema()["properties"]
    assert "network stream" in fields["live"]["description"]
    assert "replayed in real time" in fields["realtime"]["description"]
