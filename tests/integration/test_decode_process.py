"""A decode process with several cameras (a real spawned process, real Redis, real H.264
decode): a camera whose thread fails ends alone, said over the pipe without an end entry, while
the others in the process decode on and end their sessions."""

from __future__ import annotations

import multiprocessing

import pytest

from detectors.preprocess import Letterbox
from streams.decode_process import DecoderJob, ProcessSettings, run_decoder_process
from streams.decode_worker import DecoderSpec, ProcessFlag
from streams.keys import StreamKeys
from streams.messages import EndOfStream, message_kind
from tests.conftest import VIDEOS

pytestmark = pytest.mark.integration

CLIP = VIDEOS / "highway_traffic_1920x1080_30fps_20frames.mp4"  # 20 frames


class FakeFailingLetterbox:
    """The decoders' letterbox until its third frame, which it cannot prepare (a bug)."""

    def __init__(self) -> None:
        self._letterbox = Letterbox(64, 64)
        self._frames = 0

    def __call__(self, image):
        self._frames += 1
        if self._frames == 3:
            raise RuntimeError("cannot prepare this frame")
        return self._letterbox(image)


def job(camera: str, redis_url: str, prefix: str, prepare) -> DecoderJob:
    spec = DecoderSpec(
        camera=camera,
        url=str(CLIP),
        live=False,
        realtime=False,
        loop=False,
        backpressure=True,
        max_backlog=64,
    )
    return DecoderJob(spec=spec, redis_url=redis_url, prefix=prefix, prepare=prepare)


def reports_until(control, exits: int) -> list[tuple]:
    received = []
    while sum(message[0] == "exited" for message in received) < exits:
        assert control.poll(60), received
        received.append(control.recv())
    return received


def test_a_failing_camera_ends_alone_and_the_others_in_its_process_go_on(
    assets, redis_url, redis_client, prefix
):
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    stop = ProcessFlag()
    process = context.Process(
        target=run_decoder_process, args=(ProcessSettings(), stop, None, theirs)
    )
    process.start()
    try:
        ours.send(("start", job("bad", redis_url, prefix, FakeFailingLetterbox())))
        ours.send(("start", job("good", redis_url, prefix, Letterbox(64, 64))))
        received = reports_until(ours, exits=2)
        assert process.is_alive()
    finally:
        stop.set()
        process.join(30)
    assert process.exitcode == 0
    by_camera = {(m[0], m[1]): m for m in received}
    assert by_camera["exited", "bad"][3] == "RuntimeError: cannot prepare this frame"
    assert ("end", "bad") not in by_camera  # the supervisor writes it, from the progress
    assert by_camera["exited", "good"][3] is None
    end = EndOfStream.from_fields(
        {k.encode(): str(v).encode() for k, v in by_camera["end", "good"][3].items()}
    )
    assert (end.frames, end.reason) == (20, "eof")
    keys = StreamKeys(prefix)
    entries = redis_client.xrange(keys.frames("good"))
    assert sum(message_kind(f) == "frame" for _, f in entries) == 20
    bad = redis_client.xrange(keys.frames("bad"))
    assert [message_kind(f) for _, f in bad] == ["frame", "frame"]  # no end entry
    assert redis_client.hgetall(keys.progress("bad"))  # what the supervisor ends it from
