"""A live camera's decoder when the batcher is behind (real redis-server, real H.264 decode):
frames that find the stream's backlog full are skipped before they are converted or sent, and
each one is still accounted for — a seq gap the batcher counts as overflow."""

from __future__ import annotations

import subprocess
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

    def frames(self, skip=None):
        for index, frame in enumerate(super().frames(skip)):
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


@pytest.fixture(scope="module")
def gop10_clip(tmp_path_factory):
    """3 s of the 540p highway at 30 fps with a key frame every 10 frames (no B-frames), as a
    camera's sub-stream with a short GOP (cut and encoded here, never committed)."""
    clip = tmp_path_factory.mktemp("gop") / "highway_gop10.mp4"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(VIDEOS / "highway_traffic_960x540_30fps.mp4")]
        + ["-frames:v", "90", "-c:v", "libx264", "-g", "10", "-keyint_min", "10"]
        + ["-sc_threshold", "0", "-bf", "0", "-an", str(clip)],
        check=True,
    )
    return clip


def decode_all(redis_client, prefix: str, url: str, mode: str, max_fps: float = 1.0):
    keys = StreamKeys(prefix)
    spec = DecoderSpec(
        camera=mode,
        url=url,
        live=False,
        realtime=False,
        loop=False,
        backpressure=True,
        max_backlog=1000,
        max_fps=max_fps,
        decode_frames=mode,
    )
    worker = DecodeWorker(
        spec=spec, redis_client=redis_client, keys=keys, prepare=Letterbox(640, 640, rect=True)
    )
    end = worker.run(threading.Event())
    entries = redis_client.xrange(keys.frames(mode))
    frames = [FrameMessage.from_fields(f) for _, f in entries if message_kind(f) == "frame"]
    return worker, end, frames


def test_sampled_below_the_key_frame_rate_only_key_frames_are_decoded(
    assets, redis_client, prefix, gop10_clip
):
    """At 1 frame/s of a stream with a key frame every 1/3 s, ``auto`` decodes the key frames
    alone once it has measured the GOP, and publishes the very frames (same pts, same pixels)
    a full decode does; the frames never decoded are sampled out, so every packet is counted."""
    every, every_end, every_frames = decode_all(redis_client, prefix, str(gop10_clip), "all")
    keys_only, keys_end, keys_frames = decode_all(redis_client, prefix, str(gop10_clip), "auto")
    # frames 0, 30 and 60 (the clip runs at 29.97 frames/s): key frames both ways
    assert [f.pts for f in keys_frames] == [f.pts for f in every_frames] == [0.0, 1.001, 2.002]
    assert [f.pixels for f in keys_frames] == [f.pixels for f in every_frames]
    assert every.not_decoded == 0
    # the first GOP decoded whole (it measures the interval), then 8 of each 9 non-key frames
    # skipped as packets: 72 of the 90 frames never decoded; and, of the key frames between
    # those taken, the ones seen while the sampler's due time was up to date (frame threading
    # gives frames back a few packets late: a key frame skipped is never one taken)
    assert 72 < keys_only.not_decoded <= 72 + 6
    for end in (every_end, keys_end):
        assert end.frames + end.sampled_out + end.decode_errors == 90
        assert end.decode_errors == 0


@pytest.mark.parametrize("max_fps", [0.5, 2.0])
def test_sampled_above_the_key_frame_rate_only_what_the_frames_taken_need_is_decoded(
    assets, redis_client, prefix, max_fps
):
    """The highway clip as it is (a key frame every 3 s, B-frames, some of them referenced):
    key frames alone are too few, so ``auto`` decodes what the frames taken need (the
    references before each, nothing after the last of a GOP) and publishes the very frames a
    full decode does; every packet is still counted."""
    url = str(VIDEOS / "highway_traffic_960x540_30fps.mp4")
    every, every_end, every_frames = decode_all(redis_client, prefix, url, "all", max_fps)
    needed, needed_end, needed_frames = decode_all(redis_client, prefix, url, "auto", max_fps)
    assert len(every_frames) == int(335 / 29.97 * max_fps) + 1  # 11.2 s, from 0 s on
    assert [f.pts for f in needed_frames] == [f.pts for f in every_frames]
    assert [f.pixels for f in needed_frames] == [f.pixels for f in every_frames]
    assert every.not_decoded == 0 and needed.not_decoded > 335 / 4
    for end in (every_end, needed_end):
        assert end.frames + end.sampled_out + end.decode_errors == 335
        assert end.decode_errors == 0
