"""The sink registry: every module of ``streams/sinks`` is a sink its config can name, and the
JSON Lines sink writes what it is given, whole batches at a time."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from streams.messages import DetectionMessage, Timestamps
from streams.sinks import default_sinks, sink_modules, sink_options_models
from streams.sinks.base import SinkError
from streams.sinks.jsonl import JsonLinesSink
from streams.sinks.jsonl import Options as JsonLinesOptions


def test_each_sink_module_is_registered_under_its_own_name():
    modules = sink_modules()
    assert {"redis_streams", "jsonl"} <= set(modules)
    for kind, module in modules.items():
        assert module.__name__ == f"streams.sinks.{kind}"
        assert callable(module.open_sink)
    assert len(sink_options_models()) == len(modules)
    assert [options.kind for options in default_sinks()] == ["redis_streams"]


def message(seq: int) -> DetectionMessage:
    return DetectionMessage(
        camera="door",
        session="S",
        seq=seq,
        pts=seq,
        width=64,
        height=48,
        batch_id=0,
        batch_size=1,
        detections=(),
        timestamps=Timestamps(1.0, 1.0, 1.0, 1.0, 1.0),
    )


def test_jsonl_appends_whole_batches_from_many_threads(tmp_path: Path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"frame_id": "earlier"}) + "\n")  # appended to, never replaced
    sink = JsonLinesSink(JsonLinesOptions(kind="jsonl", path=path, fsync=True))
    batches = [[message(t * 100 + i) for i in range(50)] for t in range(4)]
    threads = [threading.Thread(target=sink.write, args=(batch,)) for batch in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink.close()
    ids = [json.loads(line)["frame_id"] for line in path.read_text().splitlines()]
    assert ids[0] == "earlier" and len(ids) == 1 + 200
    runs = [ids[i : i + 50] for i in range(1, 201, 50)]  # each batch's lines stay together
    assert sorted(runs) == sorted([[f"S:{m.seq}" for m in batch] for batch in batches])


def test_jsonl_names_a_file_it_cannot_open(tmp_path: Path):
    with pytest.raises(SinkError, match="sink jsonl: cannot append to .*missing/d.jsonl"):
        JsonLinesSink(JsonLinesOptions(kind="jsonl", path=tmp_path / "missing" / "d.jsonl"))


def test_jsonl_cuts_a_batch_the_disk_refused(tmp_path: Path, monkeypatch):
    path = tmp_path / "d.jsonl"
    sink = JsonLinesSink(JsonLinesOptions(kind="jsonl", path=path, fsync=True))
    sink.write([message(0)])

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("streams.sinks.jsonl.os.fsync", full_disk)
    with pytest.raises(OSError):
        sink.write([message(1), message(2)])
    monkeypatch.undo()
    sink.write([message(1), message(2)])  # the batch again, as after a restart
    sink.close()
    ids = [json.loads(line)["frame_id"] for line in path.read_text().splitlines()]
    assert ids == ["S:0", "S:1", "S:2"]
