"""``framebatch decode --summary-json``: what the decoders' status events say of each camera."""

from __future__ import annotations

from pipeline.cli.run import DecodeTally


def event(camera: str, name: str, message: str = "") -> dict[str, str]:
    fields = {"camera": camera, "event": name, "message": message, "time": "0"}
    if name == "ended":  # as streams/decode_worker.py emits it: the details beside the message
        reason, frames = message.split(": ")
        fields.update(reason=reason, frames=frames.split()[0])
    return fields


def test_each_camera_its_frames_its_end_and_its_last_error():
    tally = DecodeTally()
    for e in [
        event("file", "opened", "/clips/a.mp4"),
        event("file", "ended", "eof: 60 frames"),
        event("door", "opened", "rtsp://cam/1"),
        event("door", "crashed", "exit code -9; restarting in 1.0s"),
        event("door", "opened", "rtsp://cam/1"),
        event("door", "ended", "stopped: 25 frames"),
        event("bad", "error", "cannot open: Invalid data found"),
        event("bad", "ended", "error: 0 frames"),
    ]:
        tally.on_event(e)
    summary = tally.to_json({"file": "ended", "door": "ended", "bad": "failed", "quiet": "running"})
    assert summary == {
        "cameras": [
            {
                "camera": "file",
                "state": "ended",
                "decoded": 60,
                "sessions_ended": 1,
                "sessions_crashed": 0,
                "end_reason": "eof",
                "error": "",
            },
            {
                "camera": "door",
                "state": "ended",
                "decoded": 25,  # the crashed session sent no count
                "sessions_ended": 1,
                "sessions_crashed": 1,
                "end_reason": "stopped",
                "error": "exit code -9; restarting in 1.0s",
            },
            {
                "camera": "bad",
                "state": "failed",
                "decoded": 0,
                "sessions_ended": 1,
                "sessions_crashed": 0,
                "end_reason": "error",
                "error": "cannot open: Invalid data found",
            },
            {
                "camera": "quiet",
                "state": "running",
                "decoded": 0,
                "sessions_ended": 0,
                "sessions_crashed": 0,
                "end_reason": "",
                "error": "",
            },
        ]
    }
