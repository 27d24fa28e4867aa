"""Detections appended to a JSON Lines file, one ``framebatch consume``-style object per frame:
for archiving a run or feeding a tool that reads files.

Each batch is flushed to the operating system before its frames are acknowledged, so a crash of
the daemon loses no line (it may repeat some: de-duplicate by ``frame_id``); ``fsync: true`` also
survives a crash of the machine, at the cost of a disk sync per batch.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TextIO

from pydantic import Field, ValidationInfo, field_validator

from streams.messages import DetectionMessage
from streams.sinks.base import SinkContext, SinkError, SinkOptions


class Options(SinkOptions):
    kind: Literal["jsonl"]
    path: Path = Field(description="File to append to; relative to the config file's folder")
    fsync: bool = Field(False, description="fsync after every batch (survives power loss)")

    @field_validator("path")
    @classmethod
    def _resolve(cls, path: Path, info: ValidationInfo) -> Path:
        base_dir = (info.context or {}).get("base_dir")  # no disk access in validators
        return Path(base_dir) / path if base_dir is not None and not path.is_absolute() else path


class JsonLinesSink:
    name = "jsonl"

    def __init__(self, options: Options):
        try:
            self._file = options.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise SinkError(f"sink jsonl: cannot append to {options.path}: {exc.strerror}") from exc
        self._fsync = options.fsync
        self._lock = threading.Lock()  # one batch's lines together

    def write(self, messages: Sequence[DetectionMessage]) -> None:
        lines = "".join(json.dumps(message.to_json()) + "\n" for message in messages)
        with self._lock:
            start = self._file.tell()
            try:
                self._file.write(lines)
                self._file.flush()
                if self._fsync:
                    os.fsync(self._file.fileno())
            except OSError:
                # a full disk may have taken half a batch: cut it, so the batch written again
                # after the restart starts on a line of its own
                self._file = _reopen_truncated(self._file, start)
                raise

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _reopen_truncated(file: TextIO, size: int) -> TextIO:
    """The file cut back to ``size`` bytes, opened again (its buffer may hold the failed
    write, which closing would try to flush again)."""
    path = file.name
    try:
        file.close()
    except OSError:
        pass  # the same full disk: what it could not write is being cut anyway
    with open(path, "r+b") as raw:
        raw.truncate(size)
    return open(path, "a", encoding="utf-8")


def open_sink(options: Options, context: SinkContext) -> JsonLinesSink:
    return JsonLinesSink(options)
