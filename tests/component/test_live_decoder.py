"""A live camera's decoder when the batcher is behind (real redis-server, real H.264 decode):
frames that find the stream's backlog full are skipped before they are converted or sent, and
each one is still accounted for — a seq gap the batcher counts as overflow."""

from __future__ import annotations

import threading

import pytest

from detectors.preprocess import Letterbox
from streams.decode_worker import DecoderSpec, DecodeWorker
from streams.keys import StreamKeys
from streams.messages import FrameMessage, message_kind
from streams.sources import SourceError, VideoSource
from tests.conftest import VIDEOS

CLIP = VIDEOS / "highway_traffic_1920x1080_30fps_20frames.mp4"  # 20 frames


class CountingPreparer:
    """The decoders' letterbox, counting the frames it was asked to prepare."""

    def __init__(self) -> None:
        self.calls = 0
        self._letterbox = Letterbox(640, 640, rect=True)

    def __call__(self, image):
        self.calls += 1
        return self._letterbox(image)


@pytest.mark.parametrize("backlog", [1, 3, 64])
def test_a_full_backlog_skips_frames_before_they_cost_anything(
    assets, redis_client, prefix, backlog
):
    keys = StreamKeys(prefix)
    spec = DecoderSpec(
        camera="cam",
        url=str(CLIP),
        live=False,
        realtime=False,  # as fast as it decodes: nobody reads, the backlog fills at once
        loop=False,
        backpressure=False,  # drops frames, as a live camera does
        max_backlog=backlog,
    )
    preparer = CountingPreparer()
    worker = DecodeWorker(spec=spec, redis_client=redis_client, keys=keys, prepare=preparer)
    end = worker.run(threading.Event())
    entries = redis_client.xrange(keys.frames("cam"))
    frames = [FrameMessage.from_fields(f) for _, f in entries if message_kind(f) == "frame"]
    kept = min(backlog, 20)
    assert end.frames == 20  # every decoded frame has a seq...
    assert [f.seq for f in frames] == list(range(kept))  # ...the first ones reached Redis...
    assert preparer.calls == kept  # ...and the others were never converted or letterboxed
    progress = redis_client.hgetall(keys.progress("cam"))
    assert not progress or int(progress[b"frames"]) == 20  # the end entry replaced it


class SimulatedStallingSource(VideoSource):
    """A real clip whose stream stalls after a few frames: the blocked read fails at its
    timeout.  With ``stop`` given, the run is stopped while the read waits."""

    def __init__(self, spec: DecoderSpec, stop: threading.Event | None):
        super().__init__(spec.camera, spec.url, decode_threads=1)
        self._stop_during_wait = stop

    def frames(self):
        for index, frame in enumerate(super().frames()):
            if index == 5:
                break
            yield frame
        if self._stop_during_wait is not None:
            self._stop_during_wait.set()
        raise SourceError(f"camera {self.camera!r}: read failed: Immediate exit requested")


def test_a_stall_is_an_error_but_a_stop_during_it_is_a_stop(assets, redis_client, prefix):
    """A live camera's stalled read fails at its timeout: an error, and it reconnects.  When the
    run was stopped while the read waited, the failure is only the stop taking effect: the
    camera was connected when it was stopped, so it ends ``stopped`` without an error (the
    run's exit status counts failed cameras).  A CI run once exited 1 on exactly this."""
    keys = StreamKeys(prefix)
    spec = DecoderSpec(
        camera="cam",
        url=str(CLIP),
        live=True,
        realtime=False,
        loop=False,
        backpressure=False,
        max_backlog=64,
        reconnect_initial_s=0.01,
    )
    stop = threading.Event()
    connections = iter([None, stop])  # the first stall with the run going on, then stopped
    worker = DecodeWorker(
        spec=spec,
        redis_client=redis_client,
        keys=keys,
        prepare=Letterbox(640, 640),
        open_source=lambda spec: SimulatedStallingSource(spec, next(connections)),
    )
    end = worker.run(stop)
    events = [f[b"event"].decode() for _, f in redis_client.xrange(keys.events())]
    assert events == ["opened", "error", "reconnecting", "opened", "stalled", "ended"]
    assert (end.reason, end.error, end.frames) == ("stopped", "", 10)
