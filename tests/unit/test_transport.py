"""Frame transports: each encoder's entry, through the bytes Redis stores, back to an image."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from streams.messages import FrameMessage, ShmRef
from streams.shm_ring import segment_name
from streams.transport import (
    CAUSE_CORRUPT,
    CAUSE_GONE,
    CAUSE_LOST,
    CAUSE_OTHER_HOST,
    FrameDecoder,
    JpegEncoder,
    RawEncoder,
    ShmEncoder,
    TransportLost,
    TransportSpec,
    make_encoder,
    redis_on_this_host,
)
from tests.unit.test_messages import as_redis_stores

HOST = "unit-host/boot-1"
SHAPE = (64, 96, 3)


def letterboxed(seed: int = 0) -> np.ndarray:
    """A smooth image with an edge, like a letterboxed frame (JPEG-friendly, not flat)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
    image = np.stack([x * 2, y * 3, (x + y) % 200], axis=-1).astype(np.uint8)
    image[:10] = 114  # padding rows
    image[20:40, 30:60] = rng.integers(0, 256, 3, dtype=np.uint8)
    return image


def message_for(encoder, image: np.ndarray, seq: int = 0) -> FrameMessage:
    encoded = encoder.encode(image)
    message = FrameMessage(
        camera="cam",
        seq=seq,
        pts=None,
        width=SHAPE[1],
        height=SHAPE[0],
        scale=1.0,
        pad_x=0,
        pad_y=0,
        captured=1.0,
        enqueued=2.0,
        pixels=encoded.pixels,
        input_width=SHAPE[1],
        input_height=SHAPE[0],
        encoding=encoded.encoding,
        shm=encoded.shm,
    )
    # what the batcher gets: the entry as Redis stores it, parsed back
    return FrameMessage.from_fields(as_redis_stores(message.to_fields()))


def shm_encoder(tmp_path: Path, *, slots: int = 4, pid: int = 7, camera: str = "cam") -> ShmEncoder:
    return ShmEncoder(
        name=segment_name("t", camera, pid), slots=slots, host=HOST, directory=tmp_path
    )


def test_raw_round_trip_is_exact_and_zero_copy() -> None:
    image = letterboxed()
    message = message_for(RawEncoder(), image)
    assert message.encoding == "raw" and message.shm is None
    got = FrameDecoder(host=HOST).image(message)
    np.testing.assert_array_equal(got, image)
    assert not got.flags.writeable  # a view of the entry's bytes


def test_jpeg_round_trip_is_close() -> None:
    image = letterboxed()
    message = message_for(JpegEncoder(90), image)
    assert message.encoding == "jpeg"
    assert len(message.pixels) < image.nbytes / 3
    got = FrameDecoder(host=HOST).image(message)
    assert got.shape == SHAPE and got.dtype == np.uint8
    assert np.abs(got.astype(int) - image).mean() < 3


def test_lower_jpeg_quality_is_smaller() -> None:
    image = letterboxed()
    assert len(JpegEncoder(30).encode(image).pixels) < len(JpegEncoder(95).encode(image).pixels)


@pytest.mark.parametrize("payload", [b"not a jpeg", b""])
def test_undecodable_jpeg_is_lost_as_corrupt(payload: bytes) -> None:
    message = replace(message_for(JpegEncoder(90), letterboxed()), pixels=payload)
    with pytest.raises(TransportLost) as info:
        FrameDecoder(host=HOST).image(message)
    assert info.value.cause == CAUSE_CORRUPT


def test_jpeg_of_another_size_is_lost_as_corrupt() -> None:
    message = message_for(JpegEncoder(90), letterboxed())
    message = replace(message, input_width=SHAPE[1] * 2)
    with pytest.raises(TransportLost) as info:
        FrameDecoder(host=HOST).image(message)
    assert info.value.cause == CAUSE_CORRUPT


def test_shm_round_trip_is_exact_and_the_entry_is_small(tmp_path: Path) -> None:
    encoder = shm_encoder(tmp_path)
    decoder = FrameDecoder(shm_dir=tmp_path, host=HOST)
    images = [letterboxed(seed) for seed in range(3)]
    messages = [message_for(encoder, image, seq) for seq, image in enumerate(images)]
    assert encoder.holds_frames
    for message, image in zip(messages, images, strict=True):
        assert message.encoding == "shm" and message.pixels == b""
        assert message.shm == ShmRef(encoder.name, message.seq, 2 * message.seq + 2, HOST)
        np.testing.assert_array_equal(decoder.image(message), image)
    entry = as_redis_stores(messages[0].to_fields())
    assert sum(len(k) + len(v) for k, v in entry.items()) < 400
    decoder.close()
    encoder.close()
    assert not (tmp_path / encoder.name).exists()


def test_shm_overwritten_frame_is_lost(tmp_path: Path) -> None:
    encoder = shm_encoder(tmp_path, slots=2)
    first = message_for(encoder, letterboxed(0))
    for seq in (1, 2):
        message_for(encoder, letterboxed(seq), seq)
    with pytest.raises(TransportLost) as info:
        FrameDecoder(shm_dir=tmp_path, host=HOST).image(first)
    assert info.value.cause == CAUSE_LOST
    encoder.close()


def test_shm_segment_gone_is_lost_and_logged_once(tmp_path: Path, caplog) -> None:
    encoder = shm_encoder(tmp_path)
    messages = [message_for(encoder, letterboxed(seq), seq) for seq in range(3)]
    encoder.close()
    decoder = FrameDecoder(shm_dir=tmp_path, host=HOST)
    with caplog.at_level(logging.ERROR, logger="streams.transport"):
        for message in messages:
            with pytest.raises(TransportLost) as info:
                decoder.image(message)
            assert info.value.cause == CAUSE_GONE
    assert len(caplog.records) == 1 and "does not exist" in caplog.text


def test_shm_reference_from_another_host_is_lost(tmp_path: Path, caplog) -> None:
    encoder = shm_encoder(tmp_path)
    message = message_for(encoder, letterboxed())
    decoder = FrameDecoder(shm_dir=tmp_path, host="other-host/boot-2")
    with caplog.at_level(logging.ERROR, logger="streams.transport"):
        with pytest.raises(TransportLost) as info:
            decoder.image(message)
    assert info.value.cause == CAUSE_OTHER_HOST
    assert "use transport raw or jpeg across machines" in caplog.text
    encoder.close()


def test_a_restarted_decoder_s_new_ring_replaces_the_old_mapping(tmp_path: Path) -> None:
    old, new = shm_encoder(tmp_path, pid=1), shm_encoder(tmp_path, pid=2)
    decoder = FrameDecoder(shm_dir=tmp_path, host=HOST)
    decoder.image(message_for(old, letterboxed(0)))
    decoder.image(message_for(new, letterboxed(1)))
    assert list(decoder._shm._segments) == [new.name]
    decoder.close()
    old.close()
    new.close()


def test_shm_falls_back_to_raw_when_no_ring_can_be_made(tmp_path: Path, caplog) -> None:
    encoder = ShmEncoder(name="framebatch-t-cam-1", slots=4, host=HOST, directory=tmp_path / "x")
    with caplog.at_level(logging.WARNING, logger="streams.transport"):
        first = message_for(encoder, letterboxed(0))
        second = message_for(encoder, letterboxed(1))
    assert (first.encoding, second.encoding) == ("raw", "raw")
    assert not encoder.holds_frames
    assert len(caplog.records) == 1 and "sending frames inline" in caplog.text


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("unix:///tmp/framebatch-redis-x/redis.sock", True),
        ("redis://127.0.0.1:6379/0", True),
        ("redis://127.8.0.3:6379/0", True),
        ("redis://localhost", True),
        ("redis://[::1]:6379", True),
        ("redis://:pw@127.0.0.1:6380/2", True),
        ("redis://10.0.0.5:6379/0", False),
        ("rediss://redis.example.com:6380", False),
        ("redis://[2001:db8::1]:6379", False),
    ],
)
def test_redis_on_this_host(url: str, local: bool) -> None:
    assert redis_on_this_host(url) is local


def test_make_encoder_picks_the_transport(tmp_path: Path, caplog) -> None:
    common = {"prefix": "t", "camera": "cam", "max_backlog": 8, "pid": 3}
    local = "redis://127.0.0.1:1/0"
    assert isinstance(make_encoder(TransportSpec(), redis_url=local, **common), RawEncoder)
    assert isinstance(make_encoder(TransportSpec("jpeg"), redis_url=local, **common), JpegEncoder)
    shm = TransportSpec("shm", shm_dir=str(tmp_path))
    assert isinstance(make_encoder(shm, redis_url=local, **common), ShmEncoder)
    with caplog.at_level(logging.WARNING, logger="streams.transport"):
        remote = make_encoder(shm, redis_url="redis://10.1.2.3:6379", **common)
    assert isinstance(remote, RawEncoder)
    assert "needs Redis on this host" in caplog.text
    # auto, the config's default: shm on this host, raw elsewhere without a warning
    auto = TransportSpec("auto", shm_dir=str(tmp_path))
    assert isinstance(make_encoder(auto, redis_url=local, **common), ShmEncoder)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streams.transport"):
        assert isinstance(
            make_encoder(auto, redis_url="redis://10.1.2.3:6379", **common), RawEncoder
        )
    assert caplog.text == ""
    # a sampled camera: a ring's memory is not worth a few copies a second (shm by name is kept)
    for max_fps, kind in [(0.5, RawEncoder), (5.0, RawEncoder), (10.0, ShmEncoder)]:
        assert isinstance(make_encoder(auto, redis_url=local, max_fps=max_fps, **common), kind)
    assert isinstance(make_encoder(shm, redis_url=local, max_fps=0.5, **common), ShmEncoder)


@pytest.mark.parametrize(
    ("spec", "backlog", "slots"),
    [
        (TransportSpec("shm"), 64, 64 + 32 + 16),
        (TransportSpec("shm", shm_in_flight=8), 4, 4 + 8 + 16),
        (TransportSpec("shm", shm_slots=500), 64, 500),
    ],
)
def test_ring_slots(spec: TransportSpec, backlog: int, slots: int) -> None:
    assert spec.ring_slots(backlog) == slots


def test_unknown_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown transport"):
        TransportSpec("carrier-pigeon")


def test_entries_without_an_encoding_field_are_raw() -> None:
    fields = as_redis_stores(message_for(RawEncoder(), letterboxed()).to_fields())
    del fields[b"encoding"]
    message = FrameMessage.from_fields(fields)
    assert message.encoding == "raw"
    np.testing.assert_array_equal(message.image(), letterboxed())


def test_message_checks_its_encoding() -> None:
    message = message_for(RawEncoder(), letterboxed())
    with pytest.raises(ValueError, match="unknown frame encoding"):
        replace(message, encoding="png")
    with pytest.raises(ValueError, match="shm reference"):
        replace(message, encoding="shm")
    with pytest.raises(ValueError, match="FrameDecoder"):
        replace(message, encoding="jpeg").image()
