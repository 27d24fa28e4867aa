"""A decode process with several cameras (a real spawned process, real Redis, real H.264
decode): a camera whose thread fails ends alone, said over the pipe without an end entry, while
the others in the process decode on and end their sessions; one whose worker is gone takes
no lease back, and says its worker is gone, not Redis away, when its clients are closed."""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import replace

import pytest

from detectors.preprocess import Letterbox
from streams.decode_process import (
    DecoderJob,
    ProcessSettings,
    _Clients,
    _Reports,
    decode_camera,
    run_decoder_process,
)
from streams.decode_worker import DecoderSpec, ProcessFlag
from streams.fence import WORKER_GONE, DecodeLease, claim_session
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


def decode_in_this_thread(decoder: DecoderJob, *, worker_alive: bool) -> list[tuple]:
    """A camera's thread of a decode process, run here to its exit; its exit report(s)."""
    gone = ProcessFlag()
    if not worker_alive:
        gone.set()
    ours, theirs = multiprocessing.Pipe()
    clients = _Clients()
    try:
        decode_camera(
            decoder,
            threading.Event(),
            gone=gone,
            worker_alive=lambda: not gone.is_set(),
            released=None,
            clients=clients,
            rings=[],
            reports=_Reports(theirs),
        )
    finally:
        clients.close()
    return [m for m in reports_until(ours, exits=1) if m[0] == "exited"]


@pytest.mark.parametrize("worker_gone", [False, True])
def test_a_decoder_whose_worker_is_gone_leaves_a_lease_that_ran_out_free(
    assets, redis_url, redis_client, prefix, worker_gone
):
    """A decode process outlives its SIGKILLed worker by a moment (until the parent-death
    signal is handled): its decoders never take back a decode lease that ran out, which would
    hold the camera another TTL with nobody renewing it.  With the worker alive, they do."""
    keys = StreamKeys(prefix)
    lease = DecodeLease("w1", 60_000)
    assert claim_session(redis_client, keys, "cam", lease, "s1", final=True)
    redis_client.delete(keys.decode_lease("cam"))  # it ran out; nobody took the camera
    decoder = job("cam", redis_url, prefix, Letterbox(64, 64))
    decoder = replace(decoder, spec=replace(decoder.spec, lease=lease), session="s1")
    exited = decode_in_this_thread(decoder, worker_alive=not worker_gone)
    frames = [f for _, f in redis_client.xrange(keys.frames("cam")) if message_kind(f) == "frame"]
    if worker_gone:
        assert exited[0][3] == WORKER_GONE and not frames  # its worker, if there, ends it
        assert redis_client.get(keys.decode_lease("cam")) is None  # left for the winner
        assert redis_client.hget(keys.progress("cam"), "session") == b"s1"  # it ends it
    else:
        assert exited[0][3] is None and len(frames) == 20
        assert redis_client.get(keys.decode_lease("cam")) == b"w1"


@pytest.mark.parametrize("worker_gone", [False, True])
def test_a_redis_error_after_its_worker_is_gone_is_said_as_that(
    assets, prefix, worker_gone, caplog
):
    """A decode process whose worker died closes its Redis clients as it leaves: what its
    decoders meet then is not Redis being away (it said so, at ERROR, for each camera)."""
    decoder = job("cam", "redis://127.0.0.1:1", prefix, Letterbox(64, 64))  # nothing listens
    decoder = replace(decoder, reconnect_timeout_s=0.3)
    exited = decode_in_this_thread(decoder, worker_alive=not worker_gone)
    if worker_gone:
        assert exited[0][3] == WORKER_GONE and "its decode worker is gone" in caplog.text
        assert "Redis unreachable for more than" not in caplog.text
    else:
        assert exited[0][3] == "Redis unreachable"
        assert "Redis unreachable for more than" in caplog.text
