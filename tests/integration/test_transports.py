"""Frame transports end to end: ``framebatch run --until-done`` with ``transport: raw``, ``shm``
and ``jpeg`` over the four shared clips, and a decode process killed with SIGKILL under ``shm``.

To keep three replays within a minute on two cores, the two long clips are cut to their first
90 frames (their first GOPs, stream-copied: real H.264, decoded by PyAV like the others),
208 frames per replay instead of 1,757; test_replay.py's replay is longer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from framebatch_tools.audit import audit
from streams.keys import StreamKeys
from streams.shm_ring import SHM_DIR, ShmRing, segment_name, segment_pid
from streams.transport import host_id
from tests.conftest import MODEL, SAMPLE_CLIPS, VIDEOS
from tests.integration.clips import cut_clip
from tests.integration.matching import unmatched
from tests.integration.runner import (
    framebatch,
    published,
    run_until_done,
    start_daemon,
    wait_for,
    write_config,
)
from tests.integration.test_replay import CLIPS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CUT_FRAMES = 90
# JPEG is lossy (q90: mean absolute pixel error ~1): boxes move by a pixel or so, which
# IoU >= 0.99 does not forgive on small boxes. Measured on these 208 frames (617 boxes in the
# raw run; the same figures on every run, the pipeline is deterministic): same class and
# IoU >= 0.99 matches 17.2 % of raw boxes, IoU >= 0.9 91.1 %, IoU >= 0.5 92.5 %; at IoU >= 0.5,
# 16 of 587 JPEG boxes (2.7 %) have no raw partner. Floors: those figures less a margin for
# other ONNX Runtime / OpenCV builds.
JPEG_MATCH_FLOORS = {0.99: 0.15, 0.9: 0.88, 0.5: 0.90}
JPEG_MAX_EXTRA_RATE = 0.05  # JPEG boxes without a raw one, at IoU >= 0.5


@pytest.fixture(scope="module")
def clips(assets, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    clips = {cam: VIDEOS / clip for cam, clip in CLIPS.items()}
    for cam in ("hw540", "indoor"):
        clips[cam] = folder / CLIPS[cam]
        assert cut_clip(VIDEOS / CLIPS[cam], clips[cam], CUT_FRAMES) == CUT_FRAMES
    return clips


def segments(prefix: str) -> list[str]:
    return sorted(path.name for path in SHM_DIR.glob(f"framebatch-{prefix}-*"))


@pytest.fixture(scope="module")
def runs(clips, redis_url, redis_client_module, tmp_path_factory) -> dict[str, tuple]:
    """One replay per transport: (summary, detection messages per camera)."""
    if not SHM_DIR.is_dir():
        pytest.skip(f"no shared-memory folder {SHM_DIR}")
    results = {}
    for kind in ("raw", "shm", "jpeg"):
        prefix = f"transport-{kind}"
        config = write_config(
            tmp_path_factory.mktemp(kind) / "c.yaml",
            model=MODEL,
            cameras=[{"id": cam, "url": str(path)} for cam, path in clips.items()],
            redis_url=redis_url,
            prefix=prefix,
            max_batch_size=8,
            transport={"kind": kind, "jpeg_quality": 90},
        )
        result = run_until_done(config, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "inline" not in result.stderr  # shm did not fall back to raw
        assert segments(prefix) == []  # each decoder unlinked its ring when it was read
        results[kind] = (
            result.summary,
            {cam: published(redis_client_module, prefix, cam) for cam in clips},
        )
    return results


def detections(messages) -> list:
    return [m.to_json()["detections"] for m in messages]


@pytest.mark.parametrize("kind", ["raw", "shm", "jpeg"])
def test_every_frame_is_processed(runs, clips, kind) -> None:
    summary, messages = runs[kind]
    assert summary["dropped"] == {}
    expected = {cam: CUT_FRAMES if cam in ("hw540", "indoor") else None for cam in clips}
    for cam, msgs in messages.items():
        assert [m.seq for m in msgs] == list(range(expected[cam] or len(msgs))), cam
    assert summary["processed"] == 8 + 20 + 2 * CUT_FRAMES


def test_shm_detections_equal_raw(runs) -> None:
    _, raw = runs["raw"]
    _, shm = runs["shm"]
    for cam in raw:
        assert detections(shm[cam]) == detections(raw[cam]), cam


def labeled(message) -> list:
    return [(d.box, d.class_id) for d in message.detections]


def test_jpeg_detections_match_raw_within_the_measured_floor(runs) -> None:
    _, raw = runs["raw"]
    _, jpeg = runs["jpeg"]
    rates = {}
    for min_iou in JPEG_MATCH_FLOORS:
        raw_boxes = jpeg_boxes = missing = extra = 0
        for cam in raw:
            for want, got in zip(raw[cam], jpeg[cam], strict=True):
                problems = unmatched(labeled(want), labeled(got), min_iou=min_iou)
                raw_boxes += len(want.detections)
                jpeg_boxes += len(got.detections)
                missing += sum(p.startswith("missing") for p in problems)
                extra += sum(p.startswith("extra") for p in problems)
        rates[min_iou] = 1 - missing / raw_boxes
        print(
            f"jpeg q90 vs raw, same class and IoU >= {min_iou}: {rates[min_iou]:.3f} of "
            f"{raw_boxes} raw boxes matched; {extra} of {jpeg_boxes} jpeg boxes unmatched"
        )
    assert raw_boxes > 500
    assert all(rates[min_iou] >= floor for min_iou, floor in JPEG_MATCH_FLOORS.items()), rates
    assert extra / jpeg_boxes <= JPEG_MAX_EXTRA_RATE  # the last loop's: IoU >= 0.5


# ----------------------------------------------------------------------- a decoder killed


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def ring_of(camera: str, prefix: str) -> list[str]:
    return [s for s in segments(prefix) if s.startswith(f"framebatch-{prefix}-{camera}-")]


def test_sigkilled_decode_process_takes_only_its_cameras_and_leaves_no_segment(
    assets, redis_url, prefix, tmp_path
) -> None:
    """Under shm, two cameras to a decode process: a stale ring of a dead process goes at
    start; killing the process of ``victim`` and ``buddy`` with SIGKILL (no chance to unlink
    their rings) ends both their sessions as crashed, their rings go once the daemon sees it
    died (the frames they left in the stream stay readable through the batcher's mapping:
    none lost as ``transport_gone``), and both come back on a new process; ``other``, on
    another process, goes on untouched; its ring goes at shutdown."""
    stale = ShmRing(
        segment_name(prefix, "ghost", dead_pid()), slots=2, slot_bytes=16, host=host_id()
    )
    looping = {"realtime": True, "loop": True, "fps": 10}
    bars = str(SAMPLE_CLIPS / "bars_320x240_5fps.mp4")
    config = write_config(
        tmp_path / "kill.yaml",
        model=MODEL,
        cameras=[
            {"id": "victim", "url": bars, **looping},
            {"id": "buddy", "url": bars, **looping},
            {"id": "other", "url": str(VIDEOS / CLIPS["street"]), **looping},
        ],
        redis_url=redis_url,
        prefix=prefix,
        transport={"kind": "shm"},
        decoding={"cameras_per_process": 2},
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rings = wait_for(
            lambda: (
                [ring_of(c, prefix) for c in ("victim", "buddy", "other")]
                if all(ring_of(c, prefix) for c in ("victim", "buddy", "other"))
                else None
            ),
            60,
            "the three cameras' rings",
        )
        victim, buddy, other = (found[0] for found in rings)
        assert segment_pid(victim) == segment_pid(buddy) != segment_pid(other)
        wait_for(lambda: stale.name not in segments(prefix), 30, "the stale ring's removal")
        time.sleep(1.0)  # some frames through the rings
        os.kill(segment_pid(victim), signal.SIGKILL)
        wait_for(
            lambda: victim not in segments(prefix) and buddy not in segments(prefix),
            10,
            "the killed process's rings removed",
        )
        back = wait_for(
            lambda: ring_of("victim", prefix) and ring_of("buddy", prefix), 30, "both back"
        )
        assert segment_pid(back[0]) != segment_pid(victim)  # on a new process
        assert ring_of("other", prefix) == [other]  # untouched
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            out, err = daemon.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            out, err = daemon.communicate()
        stale.close()
    crashed = "\n".join(line for line in err.splitlines() if "died (exit code -9)" in line)
    assert "'victim'" in crashed and "'buddy'" in crashed and "'other'" not in crashed
    assert "Traceback" not in err
    assert "transport_gone" not in out + err
    assert segments(prefix) == []


# ----------------------------------------------------------------------- overload


OVERLOAD_CAMERAS = 8
OVERLOAD_S = 6.0


@pytest.mark.parametrize("kind", ["raw", "shm"])
def test_overload_loses_no_frame_in_transport(
    assets, redis_url, redis_client, prefix, tmp_path, kind
):
    """8 cameras at 30 fps against a detector that takes ~15: frames are shed, but only by the
    batching policy and the streams' caps, never in transport, and every frame is in the
    ledger or has its detections (issue #8 saw 20 % lost as transport_lost under shm)."""
    looping = {"realtime": True, "loop": True, "fps": 30}
    clip = str(VIDEOS / "highway_traffic_960x540_30fps.mp4")
    cameras = [{"id": f"cam{i}", "url": clip, **looping} for i in range(OVERLOAD_CAMERAS)]
    config = write_config(
        tmp_path / f"overload-{kind}.yaml",
        model=MODEL,
        cameras=cameras,
        redis_url=redis_url,
        prefix=prefix,
        transport={"kind": kind},
    )
    summary_path = tmp_path / "summary.json"
    daemon = start_daemon(config, "--summary-json", str(summary_path))
    try:
        keys = StreamKeys(prefix)
        wait_for(lambda: redis_client.xlen(keys.detections("cam0")) > 0, 120, "detections")
        time.sleep(OVERLOAD_S)
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, err = daemon.communicate(timeout=120)
    assert daemon.returncode == 0, err
    summary = json.loads(summary_path.read_text())
    print(kind, summary["processed"], summary["dropped"])
    assert summary["processed"] > 50
    assert sum(summary["dropped"].values()) > summary["processed"]  # it was overloaded
    assert not [cause for cause in summary["dropped"] if cause.startswith("transport")]
    for camera in summary["cameras"]:
        dropped = sum(camera["dropped"].values())
        assert camera["decoded"] == camera["processed"] + dropped + camera["in_flight"]
    reports = audit(redis_client, keys, [c["id"] for c in cameras])
    assert all(not r.detected_and_dropped for r in reports)


# ----------------------------------------------------------------------- the benchmark


def test_bench_transport_runs_every_transport(assets, tmp_path) -> None:
    output = tmp_path / "transports.json"
    proc = framebatch(
        "bench-transport",
        *("--rounds", "1", "--producers", "1", "--frames", "30", "--seconds", "10"),
        *("--output", str(output)),
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "frames/s" in proc.stdout and "shm" in proc.stdout
    summary = json.loads(output.read_text())["summary"]
    assert set(summary) == {"raw", "jpeg", "shm"}
    for figures in summary.values():
        assert figures["frames_per_round"] == [30] and figures["lost"] == {}
        assert figures["frames_per_s_median"] > 0
    assert summary["shm"]["entry_bytes_mean"] < 1024 < summary["jpeg"]["entry_bytes_mean"]
    assert summary["jpeg"]["entry_bytes_mean"] < summary["raw"]["entry_bytes_mean"] / 5
