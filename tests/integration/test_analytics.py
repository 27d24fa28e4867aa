"""Tracks, line crossings and zone visits through the real pipeline (real Redis, real decode,
the real model) equal those of the same tracker and supervision's ``LineZone`` and
``PolygonZone`` run frame by frame outside it on the same detections: at batch size 1 and 4,
with cameras mixed in batches and one of them sampled, and across a detector worker SIGKILLed
mid-run (its cameras' tracks and counts carried on by the worker that takes them over)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter

import cv2
import httpx
import numpy as np
import pytest
import redis
import supervision as sv

from framebatch_tools.audit import audit
from pipeline.analytics.tracking import bytetrack
from pipeline.config.analytics import AnalyticsConfig
from streams.embedded_redis import EmbeddedRedis
from streams.keys import StreamKeys
from streams.messages import DetectionMessage
from streams.object_events import ObjectEvent
from tests.conftest import MODEL, VIDEOS
from tests.integration.runner import (
    framebatch,
    free_port,
    published,
    run_until_done,
    start_daemon,
    stop_daemon,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

FRAMES = 150  # 5 s of the highway: five cars cross the line, a dozen enter the zone
ANALYTICS = {
    "tracker": {},
    "lines": {"gate": {"start": [100, 300], "end": [860, 300], "min_crossing_frames": 2}},
    "zones": {"near": {"polygon": [[150, 250], [800, 250], [960, 540], [0, 540]], "inertia": 1}},
}


@pytest.fixture(scope="module")
def highway(tmp_path_factory):
    """The first 150 frames of the 540p highway clip (cut here, never committed)."""
    clip = tmp_path_factory.mktemp("clips") / "highway_150.mp4"
    source = VIDEOS / "highway_traffic_960x540_30fps.mp4"
    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            str(source),
            "-frames:v",
            str(FRAMES),
            "-c",
            "copy",
            str(clip),
        ],
        check=True,
    )
    return clip


def reference(messages: list[DetectionMessage], settings: dict):
    """Track ids by frame, line crossings and zone visits from the tracker and supervision,
    fed the camera's published detections one frame after another."""
    config = AnalyticsConfig.model_validate(settings)
    tracker = bytetrack(config.tracker)
    gate = config.lines["gate"]
    line = sv.LineZone(
        sv.Point(*gate.start),
        sv.Point(*gate.end),
        triggering_anchors=(sv.Position.BOTTOM_CENTER,),
        minimum_crossing_threshold=gate.min_crossing_frames,
    )
    zone = sv.PolygonZone(np.array(config.zones["near"].polygon, dtype=int))
    ids, crossings, visits, inside = {}, set(), set(), set()
    for message in messages:
        count = len(message.detections)
        detections = sv.Detections(
            xyxy=np.array([d.box for d in message.detections], dtype=float).reshape(-1, 4),
            confidence=np.array([d.score for d in message.detections], dtype=float),
            class_id=np.array([d.class_id for d in message.detections], dtype=int),
            data={"index": np.arange(count)},
        )
        tracked = tracker.update(detections, timestamp=message.pts)
        track_ids = np.full(count, -1, dtype=int)
        if len(tracked):
            track_ids[tracked.data["index"]] = tracked.tracker_id
        ids[message.seq] = [None if t < 0 else int(t) for t in track_ids]
        confirmed = track_ids >= 0
        seen = sv.Detections(
            xyxy=detections.xyxy[confirmed],
            class_id=detections.class_id[confirmed],
            tracker_id=track_ids[confirmed],
        )
        crossed_in, crossed_out = line.trigger(seen)
        for index in np.flatnonzero(crossed_in):
            crossings.add((message.seq, int(seen.tracker_id[index]), "in"))
        for index in np.flatnonzero(crossed_out):
            crossings.add((message.seq, int(seen.tracker_id[index]), "out"))
        in_zone = zone.trigger(seen) if len(seen) else []
        for track, is_in in zip((int(t) for t in seen.tracker_id), in_zone, strict=True):
            if is_in and track not in inside:
                inside.add(track)
                visits.add((message.seq, track, "zone_enter"))
            elif not is_in and track in inside:
                inside.discard(track)
                visits.add((message.seq, track, "zone_exit"))
        alive = {t.tracker_id for t in tracker.tracks if t.tracker_id >= 0}
        for track in inside - alive:  # a track that ends leaves the zone with it
            inside.discard(track)
            visits.add((message.seq, track, "zone_exit"))
    return ids, crossings, visits


def frames_once(messages: list[DetectionMessage]) -> list[DetectionMessage]:
    """One message per frame (at-least-once delivery may repeat one: the copies must agree)."""
    by_frame: dict[str, DetectionMessage] = {}
    for message in messages:
        first = by_frame.setdefault(message.frame_id, message)
        assert [d.track_id for d in first.detections] == [d.track_id for d in message.detections], (
            f"frame {message.frame_id} published twice with different tracks"
        )
    return sorted(by_frame.values(), key=lambda m: m.seq)


def events_of(client: redis.Redis, keys: StreamKeys, camera: str) -> list[ObjectEvent]:
    return [ObjectEvent.from_fields(f) for _, f in client.xrange(keys.object_events(camera))]


def assert_as_the_reference(client: redis.Redis, prefix: str, camera: str, frames: int) -> None:
    keys = StreamKeys(prefix)
    messages = frames_once(published(client, prefix, camera))
    assert len(messages) == frames
    ids, crossings, visits = reference(messages, ANALYTICS)
    assert {m.seq: [d.track_id for d in m.detections] for m in messages} == ids
    events = events_of(client, keys, camera)
    assert len({e.id for e in events}) == len(events), "an event written twice"
    assert crossings, "the clip's cars cross the line"
    assert {(e.seq, e.track_id, e.direction) for e in events if e.kind == "line_cross"} == crossings
    assert {
        (e.seq, e.track_id, e.kind) for e in events if e.kind in ("zone_enter", "zone_exit")
    } == visits
    kinds = Counter(e.kind for e in events)
    assert kinds["track_start"] == len({t for frame in ids.values() for t in frame} - {None})


@pytest.mark.parametrize(
    ("batch", "cameras"),
    [
        (1, [{"id": "solo"}]),
        # two cameras mixed in batches of 4, one of them sampled (every 2nd frame: the
        # tracker steps by pts over the frames it never saw)
        (4, [{"id": "mixed"}, {"id": "sampled", "vid_stride": 2}]),
    ],
    ids=["batch1", "batch4-mixed-sampled"],
)
def test_tracks_and_counts_are_supervisions(
    highway, redis_url, redis_client, prefix, tmp_path, batch, cameras
):
    config = write_config(
        tmp_path / "analytics.yaml",
        model=MODEL,
        cameras=[{**c, "url": str(highway), "analytics": ANALYTICS} for c in cameras],
        redis_url=redis_url,
        prefix=prefix,
        max_batch_size=batch,
    )
    result = run_until_done(config)
    assert result.returncode == 0, result.stderr
    for camera in cameras:
        frames = FRAMES // camera.get("vid_stride", 1)
        assert_as_the_reference(redis_client, prefix, camera["id"], frames)
    # and as a user reads them: one JSON line per event, in each camera's order
    camera = cameras[0]["id"]
    read = framebatch(
        "consume",
        "--events",
        "--redis",
        redis_url,
        "--prefix",
        prefix,
        "--camera",
        camera,
        "--from-start",
        "--timeout",
        "1",
    )
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    stored = events_of(redis_client, StreamKeys(prefix), camera)
    assert [line["id"] for line in lines] == [event.id for event in stored]
    assert {line["kind"] for line in lines} >= {"track_start", "line_cross", "zone_enter"}


def test_a_killed_workers_tracks_and_counts_carry_on_elsewhere(highway, tmp_path):
    """``framebatch decode`` and two ``detect`` workers; the one holding the camera is
    SIGKILLed mid-run.  The other claims its unfinished frames and analyses them from the state
    written with the last acknowledgement: the same ids, no crossing lost or counted twice."""
    prefix, camera = "tracked", "road"
    keys = StreamKeys(prefix)
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        config = write_config(
            tmp_path / "split.yaml",
            model=MODEL,
            # a file job waits for room in its 4-frame stream: paced by the workers, it
            # waits for the take-over and nothing is dropped
            cameras=[
                {"id": camera, "url": str(highway), "realtime": False, "analytics": ANALYTICS}
            ],
            redis_url=server.url,
            prefix=prefix,
            redis={"url": server.url, "prefix": prefix, "lease_ttl_s": 2.0, "frames_maxlen": 4},
            max_batch_size=2,
        )
        workers = [
            start_daemon(config, "--http", "off", "--worker-id", f"w{i}", command="detect")
            for i in range(2)
        ]
        decoder = None
        try:
            wait_for(lambda: client.zcard(keys.workers()) == 2, 90, "two workers registered")
            owner = wait_for(lambda: client.get(keys.lease(camera)), 30, "the camera leased")
            victim = workers[int(owner.decode()[1:])]
            decoder = start_daemon(config, command="decode")
            # mid-run: past the first crossings, with tracks alive in the zone
            wait_for(
                lambda: client.xlen(keys.detections(camera)) >= FRAMES // 2, 120, "half the clip"
            )
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            decoder.wait(180)
            assert decoder.returncode == 0, decoder.stderr.read()

            def complete():
                (report,) = audit(client, keys, [camera])
                return report.ok and report.frames == FRAMES

            wait_for(complete, 120, "every frame detected", 0.5)
        finally:
            for process in [*workers, decoder]:
                if process is not None and process.poll() is None:
                    stop_daemon(process)
        assert_as_the_reference(client, prefix, camera, FRAMES)


def test_events_snapshots_are_served_with_the_apis_token_rules(highway, assets, tmp_path):
    """Two cameras on the highway, one with whole-frame snapshots, one with crops: each
    line crossing and zone entry names a JPEG of what the detector saw, written under the
    snapshots folder and served by ``/api/events/{id}/snapshot.jpg`` only with the token."""
    port, token = free_port(), "snapshot-test-token-0123456789"
    snapshots = {"kinds": ["line_cross", "zone_enter"]}
    config = write_config(
        tmp_path / "snapshots.yaml",
        model=MODEL,
        cameras=[
            {
                "id": "whole",
                "url": str(highway),
                "analytics": {**ANALYTICS, "snapshots": snapshots},
            },
            {
                "id": "cropped",
                "url": str(highway),
                "analytics": {**ANALYTICS, "snapshots": {**snapshots, "crop": True}},
            },
        ],
        redis_url=None,
        http={"listen": f"127.0.0.1:{port}", "token": token},
    )
    proc = start_daemon(config)
    authorised = {"authorization": f"Bearer {token}"}
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15, headers=authorised)

    def events(**query) -> list[dict]:
        try:
            response = client.get("/api/events", params={"limit": 500, **query})
        except httpx.TransportError:
            return []  # not listening yet
        assert response.status_code == 200, response.text
        return response.json()

    def both_cameras_done() -> bool:
        try:
            cameras = client.get("/api/cameras").json()
        except httpx.TransportError:
            return False
        return len(cameras) == 2 and all(
            camera["state"] == "ended" and camera["processed"] == FRAMES for camera in cameras
        )

    try:
        wait_for(both_cameras_done, 300, "both cameras' clips processed", 0.5)
        listed = events()
        assert listed, "the clip's cars make events"
        assert [e["time"] for e in listed] == sorted((e["time"] for e in listed), reverse=True)
        shapes = {}
        for event in listed:
            wanted = event["kind"] in snapshots["kinds"]
            assert (event["snapshot_url"] is not None) == wanted, event
            if not wanted:
                continue
            assert (tmp_path / "snapshots" / event["snapshot"]).is_file()
            picture = client.get(event["snapshot_url"])
            assert picture.status_code == 200 and picture.headers["content-type"] == "image/jpeg"
            image = cv2.imdecode(np.frombuffer(picture.content, np.uint8), cv2.IMREAD_COLOR)
            shapes.setdefault(event["camera"], []).append(image.shape[:2])
        # the model's input with its padding cut: 960x540 at imgsz 640 is 640x360
        assert set(shapes["whole"]) == {(360, 640)}
        # a box and its margin: smaller than the frame (a truck near the camera may be as tall)
        assert all(h * w < 360 * 640 for h, w in shapes["cropped"]), shapes["cropped"]
        assert np.median([h * w for h, w in shapes["cropped"]]) < 360 * 640 / 4
        crossings = events(kind="line_cross", camera="cropped")
        assert crossings and {(e["kind"], e["camera"]) for e in crossings} == {
            ("line_cross", "cropped")
        }
        assert client.get("/api/events", params={"kind": "sneeze"}).status_code == 422
        url = listed[0]["snapshot_url"] or crossings[0]["snapshot_url"]
        assert httpx.get(f"http://127.0.0.1:{port}{url}").status_code == 401
        gone = client.get("/api/events/nobody:1:0/snapshot.jpg")
        assert gone.status_code == 404 and "no snapshot" in gone.text
    finally:
        client.close()
        stop_daemon(proc)
