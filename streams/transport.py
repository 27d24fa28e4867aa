"""Frame transports: how a letterboxed frame's pixels travel from a decoder to the batcher.

* ``raw``: the pixels inline in the Redis entry (1.2 MB at 640², 737 KB at 640x384);
* ``jpeg``: JPEG bytes inline (~35 KB at quality 90; lossy, ~1 ms to encode and to decode);
* ``shm``: the pixels in the decoder's shared-memory ring (:mod:`streams.shm_ring`), only a
  reference in the entry.  Same host only: with Redis elsewhere it falls back to ``raw``;
* ``auto`` (the config's default): ``shm`` where Redis runs on this host, ``raw`` elsewhere.

A :class:`FrameEncoder` (decoder side) turns pixels into what a :class:`FrameMessage` carries;
one :class:`FrameDecoder` (batcher side) turns any frame entry back into an HxWx3 uint8 image,
or raises :class:`TransportLost` with the drop cause.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import cv2
import numpy as np

from streams.messages import FrameMessage, ShmRef
from streams.shm_ring import (
    SHM_DIR,
    RingUnavailable,
    SegmentGone,
    ShmReader,
    ShmRing,
    SlotOverwritten,
    segment_name,
)

log = logging.getLogger(__name__)

TRANSPORT_KINDS = ("auto", "raw", "jpeg", "shm")
# MAXLEN ~ trims whole stream nodes (4 KB each by default, ~10 shm entries), so a live stream
# may hold a few entries more than its cap; the ring keeps room for them too
TRIM_SLACK = 16
# auto: cameras sampled at this rate or below send pixels inline (raw): a ring's memory, 56
# slots of 640x384 (41 MB) by default, costs more than ~3.5 ms of CPU a frame for the copies
# through Redis (docs/benchmarks.md) at a few frames a second
AUTO_SHM_MIN_FPS = 5.0

# drop causes of frames lost in transport (counted like the batching policy's drops)
CAUSE_LOST = "transport_lost"  # the ring slot was overwritten before the frame was read
CAUSE_GONE = "transport_gone"  # the ring segment no longer exists
CAUSE_OTHER_HOST = "transport_other_host"  # a shm reference written on another machine
CAUSE_CORRUPT = "transport_corrupt"  # undecodable JPEG, or pixels of the wrong size


class TransportLost(Exception):
    """A frame whose pixels cannot be recovered; ``cause`` is its drop cause."""

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class TransportSpec:
    """The configured transport, as a decoder process needs it (picklable)."""

    kind: str = "raw"
    jpeg_quality: int = 90
    shm_slots: int | None = None  # None: the stream's backlog + shm_in_flight + TRIM_SLACK
    shm_in_flight: int = 32  # frames the batcher may hold that the stream no longer does
    shm_dir: str = str(SHM_DIR)

    def __post_init__(self) -> None:
        if self.kind not in TRANSPORT_KINDS:
            raise ValueError(f"unknown transport {self.kind!r} (known: {TRANSPORT_KINDS})")

    def ring_slots(self, max_backlog: int) -> int:
        """Slots of one camera's ring: more than the frames that can be referenced at once."""
        return self.shm_slots or max_backlog + self.shm_in_flight + TRIM_SLACK


def host_id() -> str:
    """This machine as a shm reference names it: hostname and boot id (changes on reboot)."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "no-boot-id"
    return f"{socket.gethostname()}/{boot_id}"


def redis_on_this_host(redis_url: str) -> bool:
    """Whether Redis is reached over a unix socket or loopback, i.e. runs on this machine."""
    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------- decoder side


@dataclass(frozen=True)
class Encoded:
    """What a :class:`FrameMessage` carries for one frame's pixels."""

    encoding: str
    pixels: bytes
    shm: ShmRef | None = None


class FrameEncoder(Protocol):
    """Turns a letterboxed HxWx3 uint8 frame into its wire form; owned by one decode worker."""

    def encode(self, pixels: np.ndarray) -> Encoded: ...

    @property
    def holds_frames(self) -> bool:
        """True when frames already sent still need this encoder alive (a shm ring)."""
        ...

    def close(self) -> None: ...


class RawEncoder:
    """Pixels inline, as they are."""

    holds_frames = False

    def encode(self, pixels: np.ndarray) -> Encoded:
        return Encoded("raw", pixels.tobytes())

    def close(self) -> None:
        pass  # nothing to release


class JpegEncoder:
    """JPEG bytes inline (OpenCV's libjpeg; BGR in, BGR out)."""

    holds_frames = False

    def __init__(self, quality: int):
        self._params = [cv2.IMWRITE_JPEG_QUALITY, quality]

    def encode(self, pixels: np.ndarray) -> Encoded:
        ok, data = cv2.imencode(".jpg", pixels, self._params)
        if not ok:
            raise ValueError(f"JPEG encoding failed for a {pixels.shape} frame")
        return Encoded("jpeg", data.tobytes())

    def close(self) -> None:
        pass  # nothing to release


class ShmEncoder:
    """Pixels into this process's ring; the entry carries the reference.

    The ring is created at the first frame (its slot size is the frame size).  When it cannot be
    created (no /dev/shm, too little room in it) this encoder logs one warning and sends raw."""

    def __init__(
        self,
        *,
        name: str,
        slots: int,
        host: str,
        directory: Path = SHM_DIR,
        slot_bytes: int | None = None,
    ):
        """``slot_bytes``: the largest frame to expect (rectangular letterboxing changes the
        size with the source's aspect); unset: the first frame's size."""
        self.name = name  # the segment's file name
        self._slots = slots
        self._slot_bytes = slot_bytes
        self._host = host
        self._directory = directory
        self._ring: ShmRing | None = None
        self._fallback: RawEncoder | None = None

    @property
    def holds_frames(self) -> bool:
        return self._ring is not None

    def encode(self, pixels: np.ndarray) -> Encoded:
        if self._fallback is not None:
            return self._fallback.encode(pixels)
        if self._ring is None:
            try:
                self._ring = ShmRing(
                    self.name,
                    slots=self._slots,
                    slot_bytes=max(self._slot_bytes or 0, pixels.nbytes),
                    host=self._host,
                    directory=self._directory,
                )
            except RingUnavailable as exc:
                log.warning("shm transport unavailable (%s): sending frames inline (raw)", exc)
                self._fallback = RawEncoder()
                return self._fallback.encode(pixels)
        slot, generation = self._ring.write(pixels)
        return Encoded("shm", b"", ShmRef(self.name, slot, generation, self._host))

    def close(self) -> None:
        if self._ring is not None:
            self._ring.close()  # idempotent: its name goes first, whatever interrupts it
        self._ring = None


def make_encoder(
    spec: TransportSpec,
    *,
    redis_url: str,
    prefix: str,
    camera: str,
    max_backlog: int,
    pid: int,
    max_frame_bytes: int | None = None,
    max_fps: float | None = None,
    run: int | None = None,
) -> FrameEncoder:
    """The encoder of one decode worker; shm (and auto) fall back to raw when Redis is on
    another host (the batcher may run there, where this machine's shared memory is out of
    reach).  ``auto`` sends the frames of a camera sampled at ``max_fps`` <=
    :data:`AUTO_SHM_MIN_FPS` inline too: its ring would hold a ring's memory (tens of MB,
    whatever the rate) to save a copy through Redis a few times a second."""
    if spec.kind == "jpeg":
        return JpegEncoder(spec.jpeg_quality)
    sampled = max_fps is not None and max_fps <= AUTO_SHM_MIN_FPS
    if spec.kind == "shm" or (spec.kind == "auto" and not sampled):
        if redis_on_this_host(redis_url):
            return ShmEncoder(
                name=segment_name(prefix, camera, pid, run),
                slots=spec.ring_slots(max_backlog),
                host=host_id(),
                directory=Path(spec.shm_dir),
                slot_bytes=max_frame_bytes,
            )
        if spec.kind == "shm":  # asked for by name: say why it is not used
            log.warning(
                "camera %r: transport shm needs Redis on this host (a unix socket or loopback "
                "address); Redis is elsewhere, so frames are sent inline (raw)",
                camera,
            )
    return RawEncoder()


# ---------------------------------------------------------------------------- batcher side


class FrameDecoder:
    """Gets the letterboxed image out of any frame entry; owned by the batcher's reader thread.

    Keeps one read-only mapping per ring in use: a camera's previous ring is unmapped when its
    frames start coming from a new one (a restarted decoder), since per-camera order means no
    frame of the old ring can follow."""

    def __init__(self, *, shm_dir: Path = SHM_DIR, host: str | None = None):
        self._shm = ShmReader(directory=shm_dir)
        self._host = host
        self._ring_of: dict[str, str] = {}  # camera -> segment it is read from
        self._reported: set[str] = set()  # one error log per segment or foreign host

    def image(self, message: FrameMessage) -> np.ndarray:
        """HxWx3 uint8 BGR pixels (read-only for raw); raises :class:`TransportLost`."""
        if message.encoding == "raw":
            return message.image()
        shape = (message.input_height, message.input_width, 3)
        if message.encoding == "jpeg":
            return self._jpeg(message, shape)
        return self._from_ring(message, shape)

    def detach(self, message: FrameMessage) -> np.ndarray | None:
        """The pixels of a frame whose encoding keeps them outside the message (shm), copied
        out now, while its slot surely holds them; None for inline encodings, which are
        decoded when the batch is made (a frame shed before then costs nothing)."""
        if message.encoding != "shm":
            return None
        return self.image(message)

    def _jpeg(self, message: FrameMessage, shape: tuple[int, int, int]) -> np.ndarray:
        try:
            image = cv2.imdecode(np.frombuffer(message.pixels, np.uint8), cv2.IMREAD_COLOR)
        except cv2.error:  # OpenCV asserts on an empty buffer instead of returning None
            image = None
        if image is None or image.shape != shape:
            got = "nothing" if image is None else f"{image.shape}"
            raise TransportLost(
                CAUSE_CORRUPT, f"camera {message.camera!r} seq {message.seq}: JPEG gave {got}"
            )
        return image

    def _from_ring(self, message: FrameMessage, shape: tuple[int, int, int]) -> np.ndarray:
        ref = message.shm
        assert ref is not None  # FrameMessage guarantees it for the shm encoding
        if self._host is None:
            self._host = host_id()  # read once, in the process that reads frames
        if ref.host != self._host:
            self._report(
                ref.host,
                f"camera {message.camera!r}: shm frames written on {ref.host}, read on "
                f"{self._host}; use transport raw or jpeg across machines",
            )
            raise TransportLost(CAUSE_OTHER_HOST, f"shm reference from host {ref.host}")
        previous = self._ring_of.get(message.camera)
        if previous != ref.segment:
            if previous is not None:
                self._shm.release(previous)
            self._ring_of[message.camera] = ref.segment
        try:
            flat = self._shm.read(ref.segment, ref.slot, ref.generation, int(np.prod(shape)))
        except SlotOverwritten as exc:
            raise TransportLost(CAUSE_LOST, str(exc)) from None
        except SegmentGone as exc:
            self._report(ref.segment, f"camera {message.camera!r}: {exc}")
            raise TransportLost(CAUSE_GONE, str(exc)) from None
        return flat.reshape(shape)

    def _report(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.error("%s (frames dropped; logged once)", message)

    def forget(self, camera: str) -> None:
        """A camera removed from the run: unmap its ring (its frames are all read)."""
        segment = self._ring_of.pop(camera, None)
        if segment is not None:
            self._shm.release(segment)

    def close(self) -> None:
        """Unmap every ring; legal in every state."""
        self._shm.close()
        self._ring_of.clear()
