"""A same-host shared-memory ring of frame slots: a plain file in ``/dev/shm``, mapped with mmap.

Each camera's decoder owns one ring (a decode process holds those of its cameras) and is its
only writer; the batcher maps it
read-only and copies pixels out by reference (segment name, slot, generation).  Plain files and
``mmap`` rather than ``multiprocessing.shared_memory``: its resource tracker unlinks segments of
processes it did not start, which breaks a reader in another process tree.

Layout: a 256-byte segment header (magic, version, slots, slot size, writer's host id), then
``slots`` slots, each a 64-byte slot header (generation, byte count) and the pixels, aligned
to a cache line.

Safe reuse is a seqlock per slot.  The writer's n-th frame (n = 0, 1, ...) goes to slot
``n % slots``: it stores the odd generation ``2n + 1`` (in progress), the pixels, then the final
generation ``2n + 2``, which the reference carries.  A reader checks the generation, copies the
pixels, then checks it again: any other value means the slot was overwritten (or is being
overwritten) and the frame is lost, never returned torn.  This relies on stores becoming visible
in program order, as on x86-64 (TSO); weakly ordered CPUs would need fences Python cannot issue.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from streams.lifeline import pid_alive

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "framebatch-"
MAGIC = b"FBRING\x00\x01"
VERSION = 1
_HEADER = struct.Struct("<8sIIQQ64s")  # magic, version, slots, slot bytes, slot stride, host id
HEADER_BYTES = 256
SLOT_HEADER_BYTES = 64  # generation (u64) then byte count (u64); padded to a cache line
_U64 = struct.Struct("<Q")
# a segment name as written by segment_name(); the reader refuses anything else, so a frame
# entry can never make it open an arbitrary file
_SEGMENT_NAME = re.compile(r"framebatch-[A-Za-z0-9_.-]+-(\d+)")


class RingError(Exception):
    """A frame cannot be read from a ring; subclasses say why."""


class SlotOverwritten(RingError):
    """The slot holds another frame now (or was overwritten while being copied)."""


class SegmentGone(RingError):
    """The segment does not exist (its writer exited or died and it was removed)."""


class RingUnavailable(OSError):
    """A ring cannot be created here (no /dev/shm, or too little room in it)."""


def segment_name(prefix: str, camera: str, pid: int, run: int | None = None) -> str:
    """``framebatch-<prefix>-<camera>[-r<run>]-<pid>``: the owner's pid lets a supervisor
    clean up; ``run``, which start of the camera's decoder this is, tells a camera restarted
    in the same process from the one before it (a reader keeps its mapping by name)."""
    tag = "" if run is None else f"-r{run}"
    return f"{SEGMENT_PREFIX}{prefix}-{camera}{tag}-{pid}"


def segment_pid(name: str) -> int | None:
    """The writer's pid from a segment name, or None when the name is not one of ours."""
    match = _SEGMENT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class ShmRing:
    """The writer: creates the segment, writes frames into slots in turn, unlinks it on close."""

    def __init__(
        self, name: str, *, slots: int, slot_bytes: int, host: str, directory: Path = SHM_DIR
    ):
        if slots < 1 or slot_bytes < 1:
            raise ValueError(
                f"a ring needs slots >= 1 and slot_bytes >= 1, got {slots}, {slot_bytes}"
            )
        self.name = name
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.path = Path(directory) / name
        self._stride = SLOT_HEADER_BYTES + _round_up(slot_bytes, SLOT_HEADER_BYTES)
        size = HEADER_BYTES + slots * self._stride
        self._written = 0
        self._map: mmap.mmap | None = None
        self._view: np.ndarray | None = None
        fd = -1
        try:
            fd = self._create()  # in the try: an exception just after the file exists unlinks it
            try:
                # reserve the memory now: a full tmpfs is an error here, not a SIGBUS later
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise RingUnavailable(
                    exc.errno,
                    f"cannot reserve {size / 2**20:.0f} MiB for {slots} frames in {directory}: "
                    f"{exc.strerror}",
                ) from None
            self._map = mmap.mmap(fd, size)
            _HEADER.pack_into(
                self._map, 0, MAGIC, VERSION, slots, slot_bytes, self._stride, host.encode()[:64]
            )
            self._view = np.frombuffer(self._map, dtype=np.uint8)
        except BaseException:
            # whatever stops the creation (a full tmpfs, the process told to go while the
            # memory is reserved, which takes a while) leaves no name behind: nobody owns it
            self.path.unlink(missing_ok=True)
            raise
        finally:
            if fd >= 0:
                os.close(fd)

    def _create(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        try:
            return os.open(self.path, flags, 0o600)
        except FileExistsError:
            # the name holds our own pid: a leftover of a dead process that had this pid before
            self.path.unlink(missing_ok=True)
            return os.open(self.path, flags, 0o600)
        except FileNotFoundError as exc:
            raise RingUnavailable(
                errno.ENOENT, f"no shared-memory folder {self.path.parent}"
            ) from exc

    def write(self, pixels: np.ndarray) -> tuple[int, int]:
        """Copy one frame into the next slot; returns ``(slot, generation)`` to reference it."""
        if self._map is None or self._view is None:
            raise ValueError(f"ring {self.name} is closed")
        flat = np.ravel(pixels)  # a view for the contiguous letterboxed frames
        nbytes = flat.nbytes
        if nbytes > self.slot_bytes:
            raise ValueError(f"frame of {nbytes} bytes > ring slot of {self.slot_bytes} bytes")
        n = self._written
        slot = n % self.slots
        header = _slot_at(slot, self._stride)
        _U64.pack_into(self._map, header, 2 * n + 1)  # odd: in progress
        start = header + SLOT_HEADER_BYTES
        self._view[start : start + nbytes] = flat.view(np.uint8)
        _U64.pack_into(self._map, header + 8, nbytes)
        generation = 2 * n + 2
        _U64.pack_into(self._map, header, generation)
        self._written = n + 1
        return slot, generation

    def close(self) -> None:
        """Unlink and unmap; legal in every state. Readers that mapped it keep their copy.

        Unlink first: a close that interrupts a write (the process is told to go mid-frame)
        may find a view of the map still alive in the traceback, and ``mmap.close`` then
        refuses; the name must go all the same, the memory goes with the process."""
        self.path.unlink(missing_ok=True)
        self._view = None  # the exported buffer must go before the map can close
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a view outlives us in a traceback: unmapped when the process exits
            self._map = None

    def __enter__(self) -> ShmRing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _slot_at(slot: int, stride: int) -> int:
    return HEADER_BYTES + slot * stride


class _Mapped:
    """One segment mapped read-only, with its header's facts."""

    def __init__(self, path: Path):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SegmentGone(f"shared-memory segment {path.name} does not exist") from None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise SegmentGone(f"shared-memory segment {path.name} is not a frame ring")
            self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        magic, version, self.slots, self.slot_bytes, self.stride, _host = _HEADER.unpack_from(
            self.map, 0
        )
        if magic != MAGIC or version != VERSION or size < HEADER_BYTES + self.slots * self.stride:
            self.map.close()
            raise SegmentGone(f"shared-memory segment {path.name} is not a frame ring")


class ShmReader:
    """The reader: maps each segment once, on first use, and copies frames out of it."""

    def __init__(self, *, directory: Path = SHM_DIR):
        self._directory = Path(directory)
        self._segments: dict[str, _Mapped] = {}

    def read(self, segment: str, slot: int, generation: int, nbytes: int) -> np.ndarray:
        """A private copy of the frame's ``nbytes`` bytes (flat uint8).

        Raises :class:`SlotOverwritten` when the slot no longer holds that generation (before
        or after the copy) and :class:`SegmentGone` when the segment cannot be mapped."""
        mapped = self._segments.get(segment)
        if mapped is None:
            if segment_pid(segment) is None:
                raise SegmentGone(f"{segment!r} is not a framebatch segment name")
            mapped = self._segments[segment] = _Mapped(self._directory / segment)
        if not 0 <= slot < mapped.slots or nbytes > mapped.slot_bytes:
            raise SlotOverwritten(
                f"slot {slot} / {nbytes} bytes outside ring {segment} "
                f"({mapped.slots} slots of {mapped.slot_bytes} bytes)"
            )
        header = _slot_at(slot, mapped.stride)
        if _U64.unpack_from(mapped.map, header)[0] != generation:
            raise SlotOverwritten(f"{segment} slot {slot} no longer holds generation {generation}")
        start = header + SLOT_HEADER_BYTES
        pixels = np.frombuffer(mapped.map, dtype=np.uint8, count=nbytes, offset=start).copy()
        if _U64.unpack_from(mapped.map, header)[0] != generation:
            raise SlotOverwritten(f"{segment} slot {slot} was overwritten while it was read")
        return pixels

    def release(self, segment: str) -> None:
        """Unmap one segment (its writer moved on to another); its memory is freed once unlinked."""
        mapped = self._segments.pop(segment, None)
        if mapped is not None:
            mapped.map.close()

    def close(self) -> None:
        """Unmap every segment; legal in every state."""
        for segment in list(self._segments):
            self.release(segment)


def segment_host(path: Path) -> str | None:
    """The writer's host id from a segment's header, or None when it is not a readable ring."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEADER.size)
    except OSError:
        return None
    if len(head) < _HEADER.size:
        return None
    magic, _version, _slots, _bytes, _stride, host = _HEADER.unpack(head)
    return host.rstrip(b"\x00").decode(errors="replace") if magic == MAGIC else None


def remove_segments(
    prefix: str,
    *,
    host: str,
    pids: Iterable[int] | None = None,
    directory: Path = SHM_DIR,
    alive: Callable[[int], bool] = pid_alive,
) -> list[str]:
    """Unlink this prefix's segments written on ``host`` whose writer is in ``pids`` or, with
    ``pids`` None, no longer alive.  Returns the names removed.

    The host check keeps a supervisor from removing a live ring of a process in another pid
    namespace (another container sharing this /dev/shm), whose pid means nothing here."""
    wanted = None if pids is None else set(pids)
    removed = []
    for path in sorted(Path(directory).glob(f"{SEGMENT_PREFIX}{prefix}-*")):
        pid = segment_pid(path.name)
        if pid is None or (pid not in wanted if wanted is not None else alive(pid)):
            continue
        if segment_host(path) not in (host, None):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue  # its writer unlinked it meanwhile
        removed.append(path.name)
    if removed:
        log.info(
            "removed %d shared-memory segment(s) of exited decoders: %s", len(removed), removed
        )
    return removed
