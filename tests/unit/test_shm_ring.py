"""The shared-memory ring: round trip, overwritten and torn slots, missing segments, cleanup.

Rings live in a temporary folder (mmap of a regular file behaves as one in /dev/shm); the torn
write test runs the writer in another process, as the decoder does.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from streams.shm_ring import (
    HEADER_BYTES,
    RingUnavailable,
    SegmentGone,
    ShmReader,
    ShmRing,
    SlotOverwritten,
    remove_segments,
    segment_name,
    segment_pid,
)

HOST = "test-host/boot-1"
SHAPE = (48, 64, 3)
NBYTES = int(np.prod(SHAPE))


def frame(value: int) -> np.ndarray:
    return np.full(SHAPE, value % 256, dtype=np.uint8)


def ring(directory: Path, slots: int = 4, pid: int = 1234) -> ShmRing:
    return ShmRing(
        segment_name("t", "cam", pid),
        slots=slots,
        slot_bytes=NBYTES,
        host=HOST,
        directory=directory,
    )


def test_round_trip_in_slot_order(tmp_path: Path) -> None:
    reader = ShmReader(directory=tmp_path)
    with ring(tmp_path, slots=3) as writer:
        refs = []
        for n in range(5):
            image = np.random.default_rng(n).integers(0, 256, SHAPE, dtype=np.uint8)
            refs.append((writer.write(image), image))
        assert [slot for (slot, _), _ in refs] == [0, 1, 2, 0, 1]
        assert [gen for (_, gen), _ in refs] == [2, 4, 6, 8, 10]
        for (slot, generation), image in refs[2:]:  # the last 3 are still in the ring
            got = reader.read(writer.name, slot, generation, NBYTES)
            np.testing.assert_array_equal(got.reshape(SHAPE), image)
    reader.close()


def test_read_is_a_private_copy(tmp_path: Path) -> None:
    reader = ShmReader(directory=tmp_path)
    with ring(tmp_path, slots=1) as writer:
        slot, generation = writer.write(frame(7))
        got = reader.read(writer.name, slot, generation, NBYTES)
        writer.write(frame(9))  # reuses the slot
        assert (got == 7).all()
    reader.close()


def test_overwritten_slot_is_detected(tmp_path: Path) -> None:
    reader = ShmReader(directory=tmp_path)
    with ring(tmp_path, slots=2) as writer:
        first = writer.write(frame(1))
        writer.write(frame(2))
        writer.write(frame(3))  # lands on the first frame's slot
        with pytest.raises(SlotOverwritten, match="no longer holds generation 2"):
            reader.read(writer.name, *first, NBYTES)
    reader.close()


def test_slot_being_written_is_not_read(tmp_path: Path) -> None:
    """An odd generation (the writer stopped mid-frame, e.g. killed) never matches a reference."""
    reader = ShmReader(directory=tmp_path)
    with ring(tmp_path, slots=2) as writer:
        slot, generation = writer.write(frame(1))
        assert slot == 0
        with open(writer.path, "r+b") as file:  # what write() stores first on the next lap
            file.seek(HEADER_BYTES)
            file.write(struct.pack("<Q", generation + 3))
        with pytest.raises(SlotOverwritten):
            reader.read(writer.name, slot, generation, NBYTES)
    reader.close()


BIG = (640, 640, 3)  # a real frame's size: copies long enough to be overwritten midway


def _write_forever(directory: str, name: str, stop) -> None:
    size = int(np.prod(BIG))
    writer = ShmRing(name, slots=1, slot_bytes=size, host=HOST, directory=Path(directory))
    frames = [np.full(BIG, value, np.uint8) for value in range(256)]
    pauses = np.random.default_rng(0).uniform(0, 0.001, 4096)  # let some reads finish
    n = 0
    try:
        while not stop.is_set():
            writer.write(frames[n % 256])
            time.sleep(pauses[n % 4096])
            n += 1
    finally:
        writer.close()


def test_torn_writes_are_never_returned(tmp_path: Path) -> None:
    """A writer process rewrites a one-slot ring as fast as it can; every read either returns
    a whole frame (one value throughout) or raises, never a mix of two frames."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    name = segment_name("t", "torn", 1)
    writer = context.Process(target=_write_forever, args=(str(tmp_path), name, stop))
    writer.start()
    reader = ShmReader(directory=tmp_path)
    whole = lost = midway = 0
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / name).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(tmp_path / name, "rb", buffering=0) as file:
            deadline = time.monotonic() + 10
            while whole + lost < 3000 and time.monotonic() < deadline:
                raw = os.pread(file.fileno(), 8, HEADER_BYTES)
                if len(raw) < 8:
                    continue  # the file is there but not sized yet
                generation = struct.unpack("<Q", raw)[0]
                if generation == 0:
                    continue  # nothing written yet
                if generation % 2:
                    generation += 1  # ask for the frame being written: must come back whole
                try:
                    got = reader.read(name, 0, generation, int(np.prod(BIG)))
                except SlotOverwritten as exc:
                    lost += 1
                    midway += "while it was read" in str(exc)
                    continue
                whole += 1
                assert (got == got[0]).all(), "a torn frame was returned"
                assert got[0] == (generation // 2 - 1) % 256
    finally:
        stop.set()
        writer.join(10)
        reader.close()
    assert writer.exitcode == 0
    print(f"whole {whole}, lost {lost}, of which overwritten midway {midway}")
    assert whole > 0 and lost > 0  # both outcomes happened: the check was exercised


def test_missing_segment_raises_segment_gone(tmp_path: Path) -> None:
    reader = ShmReader(directory=tmp_path)
    with pytest.raises(SegmentGone, match="does not exist"):
        reader.read(segment_name("t", "cam", 99), 0, 2, NBYTES)
    writer = ring(tmp_path)
    ref = writer.write(frame(1))
    writer.close()  # unlinked before the reader mapped it
    with pytest.raises(SegmentGone):
        reader.read(writer.name, *ref, NBYTES)
    reader.close()


def test_a_mapped_segment_stays_readable_after_unlink(tmp_path: Path) -> None:
    reader = ShmReader(directory=tmp_path)
    writer = ring(tmp_path)
    first, second = writer.write(frame(1)), writer.write(frame(2))
    reader.read(writer.name, *first, NBYTES)
    writer.close()
    assert not writer.path.exists()
    assert (reader.read(writer.name, *second, NBYTES) == 2).all()
    reader.close()


@pytest.mark.parametrize("name", ["../../etc/passwd", "framebatch-t-cam", "other-t-cam-12"])
def test_reader_refuses_names_that_are_not_segments(tmp_path: Path, name: str) -> None:
    with pytest.raises(SegmentGone, match="not a framebatch segment"):
        ShmReader(directory=tmp_path).read(name, 0, 2, NBYTES)


def test_reader_refuses_a_file_that_is_not_a_ring(tmp_path: Path) -> None:
    name = segment_name("t", "cam", 5)
    (tmp_path / name).write_bytes(b"\x00" * 4096)
    with pytest.raises(SegmentGone, match="not a frame ring"):
        ShmReader(directory=tmp_path).read(name, 0, 2, NBYTES)


def test_slot_outside_the_ring_is_refused(tmp_path: Path) -> None:
    reader = ShmReader(directory=tmp_path)
    with ring(tmp_path, slots=2) as writer:
        writer.write(frame(1))
        with pytest.raises(SlotOverwritten, match="outside ring"):
            reader.read(writer.name, 5, 2, NBYTES)
        with pytest.raises(SlotOverwritten, match="outside ring"):
            reader.read(writer.name, 0, 2, NBYTES + 1)
    reader.close()


def test_writer_refuses_frames_larger_than_a_slot(tmp_path: Path) -> None:
    with ring(tmp_path) as writer, pytest.raises(ValueError, match="ring slot"):
        writer.write(np.zeros(NBYTES + 1, np.uint8))


def test_missing_folder_makes_the_ring_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RingUnavailable):
        ring(tmp_path / "no-such-dir")


def test_segment_names_carry_the_owner_pid() -> None:
    name = segment_name("fb-x", "door.1", 4242)
    assert name == "framebatch-fb-x-door.1-4242"
    assert segment_pid(name) == 4242
    assert segment_pid("framebatch-fb-door") is None
    restarted = segment_name("fb-x", "door.1", 4242, run=2)  # the camera's second start
    assert restarted == "framebatch-fb-x-door.1-r2-4242" and segment_pid(restarted) == 4242


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_remove_segments_of_dead_pids_only(tmp_path: Path) -> None:
    alive = ring(tmp_path, pid=1)
    dead = ring(tmp_path, pid=dead_pid())
    other_prefix = ShmRing(
        segment_name("u", "cam", dead_pid()), slots=1, slot_bytes=8, host=HOST, directory=tmp_path
    )
    other_host = ShmRing(
        segment_name("t", "cam2", dead_pid()), slots=1, slot_bytes=8, host="elsewhere/boot",
        directory=tmp_path,
    )  # fmt: skip
    removed = remove_segments("t", host=HOST, directory=tmp_path)
    assert removed == [dead.name]
    assert alive.path.exists() and other_prefix.path.exists() and other_host.path.exists()
    for writer in (alive, dead, other_prefix, other_host):
        writer.close()  # legal after the unlink too


def test_remove_segments_of_given_pids(tmp_path: Path) -> None:
    mine = ring(tmp_path, pid=101)
    theirs = ring(tmp_path, pid=102)
    assert remove_segments("t", host=HOST, pids=[101], directory=tmp_path) == [mine.name]
    assert theirs.path.exists() and not mine.path.exists()
    theirs.close()
    mine.close()


class _Interrupted(BaseException):
    """What a signal's handler raises in a decoder told to go (``ParentGone``)."""


def test_a_ring_interrupted_while_it_is_created_leaves_no_name(tmp_path: Path, monkeypatch):
    """Reserving a ring's memory takes a while: a decoder told to go then (its daemon gone)
    left the half-made segment behind, owned by nobody."""

    def interrupted(fd: int, offset: int, size: int) -> None:
        raise _Interrupted

    monkeypatch.setattr(os, "posix_fallocate", interrupted)
    with pytest.raises(_Interrupted):
        ring(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_ring_interrupted_as_its_file_is_made_leaves_no_name(tmp_path: Path, monkeypatch):
    """The signal lands as ``os.open`` returns, before the memory is reserved: the file
    exists already and must go as well."""
    create = ShmRing._create

    def created_then_interrupted(self: ShmRing) -> int:
        os.close(create(self))
        raise _Interrupted

    monkeypatch.setattr(ShmRing, "_create", created_then_interrupted)
    with pytest.raises(_Interrupted):
        ring(tmp_path)
    assert list(tmp_path.iterdir()) == []
