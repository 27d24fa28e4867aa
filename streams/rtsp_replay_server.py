#!/usr/bin/python3
"""Loopback RTSP replay server: serves a video clip as an endless live H.264 stream.

Runs under the *system* interpreter (``/usr/bin/python3``), which has PyGObject and
GStreamer's ``gst-rtsp-server``; the project venv has neither.

    /usr/bin/python3 streams/rtsp_replay_server.py --port 8554 --mount /cam1 \
        --file clip.mp4 [--fps 30] [--max-frames 300]

The clip is decoded once into memory (at most ``--max-frames`` raw I420 frames) and
replayed in a loop through an ``appsrc`` with monotonically increasing timestamps, so
clients never see an end of stream. All clients share one encoding pipeline. Once the
server listens it prints exactly one line, ``READY rtsp://127.0.0.1:PORT/MOUNT``.
``--port 0`` lets the OS choose a free port; the READY line carries the real one.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

HOST = "127.0.0.1"
DEFAULT_FPS = Fraction(30)  # used when the container reports no frame rate
DECODE_STALL_S = 10.0


@dataclass(frozen=True)
class Clip:
    """Decoded raw frames plus the caps that describe them."""

    frames: list[GLib.Bytes]
    width: int
    height: int
    fps: Fraction

    @property
    def caps(self) -> str:
        return (
            f"video/x-raw,format=I420,width={self.width},height={self.height},"
            f"pixel-aspect-ratio=1/1,framerate={self.fps.numerator}/{self.fps.denominator}"
        )


def decode_clip(path: Path, max_frames: int, fps: Fraction | None) -> Clip:
    """Decode up to ``max_frames`` frames of ``path`` to I420 in memory."""
    # GStreamer (not ffmpeg) does the decoding so the buffers' row strides are exactly
    # the ones the I420 caps of the serving pipeline imply, even for odd widths.
    pipeline = Gst.parse_launch(
        "filesrc name=file ! decodebin ! videoconvert ! video/x-raw,format=I420 "
        "! appsink name=sink sync=false max-buffers=4"
    )
    pipeline.get_by_name("file").set_property("location", str(path))
    sink = pipeline.get_by_name("sink")
    bus = pipeline.get_bus()
    frames: list[GLib.Bytes] = []
    width = height = 0
    rate = Fraction(0)
    pipeline.set_state(Gst.State.PLAYING)
    try:
        stalled_at = time.monotonic()
        while len(frames) < max_frames:
            # Short pulls so decoder errors (which never reach the appsink) surface fast.
            sample = sink.emit("try-pull-sample", Gst.SECOND // 10)
            if sample is None:
                msg = bus.pop_filtered(Gst.MessageType.ERROR)
                if msg is not None:
                    raise RuntimeError(f"cannot decode {path}: {msg.parse_error()[0].message}")
                if sink.get_property("eos"):
                    break
                if time.monotonic() - stalled_at > DECODE_STALL_S:
                    raise RuntimeError(f"cannot decode {path}: no frame for {DECODE_STALL_S}s")
                continue
            stalled_at = time.monotonic()
            if not frames:
                s = sample.get_caps().get_structure(0)
                width = s.get_int("width")[1]
                height = s.get_int("height")[1]
                ok, num, den = s.get_fraction("framerate")
                if ok and num > 0 and den > 0:
                    rate = Fraction(num, den)
            buf = sample.get_buffer()
            frames.append(GLib.Bytes.new(buf.extract_dup(0, buf.get_size())))
    finally:
        pipeline.set_state(Gst.State.NULL)
    if not frames:
        raise RuntimeError(f"cannot decode {path}: no video frames")
    return Clip(frames, width, height, fps or rate or DEFAULT_FPS)


class Feeder:
    """Pushes the clip's frames into one media's appsrc in a loop, paced in real time."""

    def __init__(self, appsrc: Gst.Element, clip: Clip) -> None:
        self._src = appsrc
        self._clip = clip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtsp-feeder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def _running_time(self) -> int | None:
        clock = self._src.get_clock()  # None until the pipeline is PLAYING
        return None if clock is None else clock.get_time() - self._src.get_base_time()

    def _run(self) -> None:
        clip = self._clip
        num, den = clip.fps.numerator, clip.fps.denominator
        offset: int | None = None  # running time of frame 0
        n = 0
        while not self._stop.is_set():
            now = self._running_time()
            if now is None:
                self._stop.wait(0.01)
                continue
            if offset is None:
                # Anchor at the current running time so the first frame is not late.
                offset = now
            pts = offset + n * Gst.SECOND * den // num
            if pts > now:
                self._stop.wait((pts - now) / Gst.SECOND)
                continue
            buf = Gst.Buffer.new_wrapped_bytes(clip.frames[n % len(clip.frames)])
            buf.pts = pts
            buf.duration = (n + 1) * Gst.SECOND * den // num - (pts - offset)
            ret = self._src.emit("push-buffer", buf)
            if ret == Gst.FlowReturn.FLUSHING:  # pipeline shutting down or restarting
                self._stop.wait(0.01)
            n += 1


class LoopingFactory(GstRtspServer.RTSPMediaFactory):
    """Shared media factory whose pipeline is fed from the in-memory clip."""

    def __init__(self, clip: Clip) -> None:
        super().__init__()
        self._clip = clip
        key_int = max(1, round(clip.fps))  # a keyframe every second: fast client join
        # leaky appsrc: while the server blocks the pipeline (live preroll, no clients),
        # stale frames are dropped instead of queueing without bound.
        self.set_launch(
            "( appsrc name=src format=time is-live=true do-timestamp=false "
            f"leaky-type=downstream max-buffers=4 caps={clip.caps} "
            f"! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={key_int} "
            "! rtph264pay name=pay0 pt=96 config-interval=1 )"
        )
        self.set_shared(True)
        self.connect("media-configure", self._on_media_configure)

    def _on_media_configure(self, _factory: object, media: GstRtspServer.RTSPMedia) -> None:
        # A new shared media is built whenever the previous one was torn down (e.g. the
        # last client left), so each media gets its own feeder.
        appsrc = media.get_element().get_by_name_recurse_up("src")
        feeder = Feeder(appsrc, self._clip)
        media.connect("unprepared", lambda _media: feeder.stop())
        feeder.start()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True, help="TCP port; 0 picks a free one")
    p.add_argument("--mount", default="/cam1", help="mount point, e.g. /cam1")
    p.add_argument("--file", type=Path, required=True, help="video clip to serve")
    p.add_argument("--fps", type=Fraction, default=None, help="output rate, e.g. 30 or 30000/1001")
    p.add_argument("--max-frames", type=int, default=300, help="frames kept in memory")
    args = p.parse_args(argv)
    if not args.mount.startswith("/"):
        p.error("--mount must start with '/'")
    if args.fps is not None and args.fps <= 0:
        p.error("--fps must be positive")
    if args.max_frames < 1:
        p.error("--max-frames must be >= 1")
    if not args.file.is_file():
        p.error(f"no such file: {args.file}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Gst.init(None)
    try:
        clip = decode_clip(args.file, args.max_frames, args.fps)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1

    server = GstRtspServer.RTSPServer()
    server.set_address(HOST)  # loopback only
    server.set_service(str(args.port))
    server.get_mount_points().add_factory(args.mount, LoopingFactory(clip))
    if server.attach(None) == 0:
        print(f"cannot listen on {HOST}:{args.port}", file=sys.stderr)
        return 1

    loop = GLib.MainLoop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, loop.quit)
    print(f"READY rtsp://{HOST}:{server.get_bound_port()}{args.mount}", flush=True)
    print(
        f"serving {args.file.name}: {len(clip.frames)} frames {clip.width}x{clip.height} "
        f"@ {float(clip.fps):.3f} fps",
        file=sys.stderr,
        flush=True,
    )
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
