"""The decoder supervisor: one decode process per camera, restarted with backoff when a live
camera's dies, each stopped on its own (a camera removed live) or all together.

A decoder that dies without its end entry (segfault, OOM kill) gets one written here from the
progress it kept, so every session of every camera ends in the frames stream.  Every session's
end entry is also kept here until it has been read: Redis restarting without its data can take
an end entry with it (a file camera's decoder that finished before the restart), and the run
would wait for it for ever; after such a loss the lost ones are written again.  With the shm
transport a decoder's ring outlives it until its frames are read; the rings of decoders that
died are removed here.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import redis

from pipeline.config import CameraConfig, Config
from pipeline.supervisor.builders import (
    decode_threads,
    decoder_spec,
    frame_letterbox,
    transport_spec,
)
from pipeline.supervisor.part import Part
from pipeline.supervisor.services import Services
from streams.decode_worker import DecoderJob, DecoderSpec, ProcessFlag, run_decoder_process
from streams.events import EventLog
from streams.keys import StreamKeys
from streams.messages import EndOfStream, message_kind, session_progress
from streams.shm_ring import remove_segments
from streams.transport import host_id

log = logging.getLogger(__name__)

DECODER_JOIN_S = 5.0
RESTART_BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0  # a decoder up this long has recovered: its restart backoff resets


def dead_session_end(
    client: redis.Redis, keys: StreamKeys, camera: str, message: str
) -> dict[str, str | int]:
    """The end entry of a decoder that died without writing one, from the progress it kept
    (its session and frame count: frames trimmed after the last one read are then counted);
    frames -1 when it kept none."""
    progress = session_progress(client.hgetall(keys.progress(camera)))
    client.delete(keys.progress(camera))
    if progress is None:
        return EndOfStream(camera, -1, "crashed", message).to_fields()
    session, frames, redis_down = progress
    end = EndOfStream(camera, frames, "crashed", message, session=session, redis_down=redis_down)
    return end.to_fields()


def abandon_rings(prefix: str) -> None:
    """Exiting at once (a second signal): the shm rings of decoders that died before the
    supervisor's next tick would find them go now (a live decoder unlinks its own ring when it
    sees its daemon gone)."""
    remove_segments(prefix, host=host_id())


@dataclass
class _Decoder:
    spec: DecoderSpec
    stop: ProcessFlag  # this decoder's own: a camera removed live stops alone
    process: multiprocessing.process.BaseProcess
    ends: Connection  # the process sends its session's end entry here
    removing: bool = False  # removed through the API: drains, never restarts
    kill_at: float | None = None  # removing: killed if still running then
    restarts: int = 0  # since the last healthy period: sets the backoff
    restart_at: float | None = None
    finished: bool = False
    started_at: float = field(default_factory=time.monotonic)


class DecoderSupervisor(Part):
    """Owned by the supervisor's thread: ``launch``, then ``tick`` until the run ends, then
    ``stop`` and ``close`` (see :mod:`pipeline.daemon` for the whole stop order)."""

    def __init__(
        self,
        config: Config,
        services: Services,
        *,
        until_done: bool = False,
        rings_read_here: bool = True,
    ):
        """``rings_read_here``: this process's detector workers read the decoders' shm rings,
        which may go once those workers have stopped (``close``); otherwise (split roles) a
        decoder keeps its ring until its stream is read, or nobody read it for a while."""
        self._config = config
        self._client = services.client
        self._keys = services.keys
        self._accounting = services.accounting
        self._states = services.states
        self._until_done = until_done
        self._decoders: dict[str, _Decoder] = {}
        self._sessions: dict[str, int] = {}  # decoder processes started per camera
        self._stopping = False  # no restarts from here on
        self._host = host_id()
        self._released = ProcessFlag() if rings_read_here else None
        self._redis_url = services.redis_url
        self._letterbox = frame_letterbox(config)  # square, or rect where the model allows it
        self._transport = transport_spec(config)
        # every camera this run decoded: decoders thread by how many there are
        self._camera_ids = {camera.id for camera in config.cameras}
        # end entries written (by a decoder, or here for one that died) and not read yet
        self._unread_ends: dict[str, list[dict[str, str | int]]] = {}
        self._redis_losses = 0

    # --- lifecycle ------------------------------------------------------------------------------
    def launch(self) -> None:
        """A decoder for each of the config's cameras."""
        for camera in self._config.cameras:
            self.add(camera)

    def tick(self) -> None:
        """Restart decoders of live cameras that died, end the sessions of those that died
        without an end entry, kill removed ones that will not stop; with ``until_done``, once
        every file camera ended, stop the live ones too."""
        now = time.monotonic()
        for decoder in self._decoders.values():
            self._collect_ends(decoder)
            if not decoder.finished:
                self._check(decoder, now)
        for camera, ends in self._unread_ends.items():
            self._unread_ends[camera] = [
                end
                for end in ends
                if not self._accounting.session_ended(camera, str(end["session"]))
            ]
        losses = self._accounting.redis_losses()
        if losses != self._redis_losses:
            self._redis_losses = losses
            self._write_lost_ends()
        files = [c for c, d in self._decoders.items() if not d.spec.live and not d.removing]
        if self._until_done and self._accounting.ended(files):
            self.stop()  # files are done: live cameras stop and end too

    def done(self) -> bool:
        """Every decoder finished (file jobs decoded, or stopped)."""
        return all(decoder.finished for decoder in self._decoders.values())

    def stop(self) -> None:
        """No more restarts; every decoder is asked to stop."""
        self._stopping = True
        for decoder in self._decoders.values():
            decoder.stop.set()

    def close(self) -> None:
        """After the detector workers stopped: rings released, decoders joined (stop → join →
        terminate → kill: none is left behind), the rings of any killed on the way removed."""
        if self._released is not None:
            self._released.set()
        self.stop()
        decoders = list(self._decoders.values())
        deadline = time.monotonic() + DECODER_JOIN_S
        for decoder in decoders:
            decoder.process.join(max(0.0, deadline - time.monotonic()))
        for decoder in decoders:
            if decoder.process.is_alive():
                decoder.process.terminate()
                decoder.process.join(2.0)
            if decoder.process.is_alive():
                decoder.process.kill()
                decoder.process.join()
        pids = [d.process.pid for d in decoders]
        remove_segments(self._keys.prefix, host=self._host, pids=pids)
        for decoder in decoders:
            decoder.ends.close()

    # --- cameras --------------------------------------------------------------------------------
    def add(self, camera: CameraConfig) -> None:
        """Start the camera's decoder (a camera removed before may come back under its id)."""
        self._camera_ids.add(camera.id)
        spec = decoder_spec(
            camera,
            default_backlog=self._config.redis.frames_maxlen,
            until_done=self._until_done,
            decode_threads=decode_threads(self._config, len(self._camera_ids)),
            # a live camera keeps at most one batch waiting in its stream: beyond that the
            # pipeline is behind, and older frames would only raise the latency
            live_backlog=self._config.batching.max_batch_size,
        )
        stop = ProcessFlag()  # a decoder killed while waiting cannot hang set()
        process, ends = self._spawn(spec, stop)
        previous = self._decoders.get(camera.id)
        if previous is not None:  # a camera removed before, back under its id
            self._collect_ends(previous)
            previous.ends.close()
        self._decoders[camera.id] = _Decoder(spec, stop, process, ends)

    def remove(self, camera: str) -> None:
        """Stop the camera's decoder for good; one that hangs is killed after a while."""
        decoder = self._decoders[camera]
        decoder.removing = True
        if decoder.restart_at is not None:  # dead, its end entry written: not restarted
            decoder.restart_at, decoder.finished = None, True
        decoder.stop.set()
        decoder.kill_at = time.monotonic() + DECODER_JOIN_S

    def known(self, camera: str) -> bool:
        return camera in self._decoders

    def removing(self, camera: str) -> bool:
        return self._decoders[camera].removing

    def retire(self, camera: str) -> None:
        """A removed camera is drained: its decoder is looked after no more."""
        self._decoders[camera].finished = True

    def removals(self) -> list[str]:
        """Cameras removed (draining, or drained)."""
        return [camera for camera, d in self._decoders.items() if d.removing]

    def active(self) -> int:
        """Cameras decoded and not removed."""
        return sum(not d.removing for d in self._decoders.values())

    def gone(self, camera: str) -> bool:
        """The camera's decoder process has exited, and every session it started has its end
        entry read by the accounting (not only an earlier one's: a restart, a re-added id)."""
        if self._decoders[camera].process.is_alive():
            return False
        return self._accounting.end_count(camera) >= self._sessions.get(camera, 0)

    # --- inside -------------------------------------------------------------------------------
    def _job(self, spec: DecoderSpec) -> DecoderJob:
        return DecoderJob(
            spec=spec,
            redis_url=self._redis_url,
            prefix=self._keys.prefix,
            prepare=self._letterbox,
            transport=self._transport,
            cluster=self._config.redis.cluster,
            reconnect_timeout_s=self._config.redis.reconnect_timeout_s,
            max_frame_bytes=self._letterbox.max_bytes,
            log_level=logging.getLogger().getEffectiveLevel(),  # -v reaches the decoders
            parent_pid=os.getpid(),  # a decoder dies with this process, however it ends
        )

    def _spawn(
        self, spec: DecoderSpec, stop: ProcessFlag
    ) -> tuple[multiprocessing.process.BaseProcess, Connection]:
        """The decoder process, and the end of the pipe it sends its end entry through."""
        self._sessions[spec.camera] = self._sessions.get(spec.camera, 0) + 1  # each ends once
        context = multiprocessing.get_context("spawn")
        ends, sends = context.Pipe(duplex=False)
        process = context.Process(
            target=run_decoder_process,
            args=(self._job(spec), stop, self._released, sends),
            name=f"fb-decoder-{spec.camera}",
            daemon=True,
        )
        process.start()
        sends.close()  # the process holds its own copy
        return process, ends

    def _collect_ends(self, decoder: _Decoder) -> None:
        """The end entries the decoder's processes sent, kept until read."""
        try:
            while decoder.ends.poll():
                self._keep_end(decoder.spec.camera, decoder.ends.recv())
        except (EOFError, OSError):
            pass  # the process is gone and sent everything it had: nothing more to read

    def _keep_end(self, camera: str, fields: dict[str, str | int]) -> None:
        if fields.get("session"):  # an end without a session cannot be told from another
            self._unread_ends.setdefault(camera, []).append(fields)

    def _write_lost_ends(self) -> None:
        """Redis lost its data: the end entries that went with it, written again (the reader
        then counts the frames lost with them as ``redis_lost``).  An entry is lost when the
        stream no longer holds it and the accounting has not read it, looked at in that
        order: the reader counts an entry before it deletes it."""
        for camera, ends in self._unread_ends.items():
            key = self._keys.frames(camera)
            in_stream = {
                fields.get(b"session", b"").decode()
                for _id, fields in self._client.xrange(key)
                if message_kind(fields) == "end"
            }
            unread = []
            for end in ends:
                session = str(end["session"])
                if self._accounting.session_ended(camera, session):
                    continue
                unread.append(end)
                if session not in in_stream:
                    log.warning("camera %s: end of session %s lost, written again", camera, session)
                    self._client.xadd(key, end)
            self._unread_ends[camera] = unread

    def _check(self, decoder: _Decoder, now: float) -> None:
        process = decoder.process
        if process.is_alive():
            if decoder.restarts and now - decoder.started_at >= HEALTHY_AFTER_S:
                decoder.restarts = 0  # a crash after a healthy spell starts at 1 s again
            if decoder.kill_at is not None and now >= decoder.kill_at:
                log.warning("camera %s: decoder did not stop, killed", decoder.spec.camera)
                process.kill()  # its end entry is written once it is found dead
                decoder.kill_at = None
            return
        if decoder.restart_at is not None:
            if now >= decoder.restart_at and not self._stopping:
                self._collect_ends(decoder)
                decoder.ends.close()
                decoder.process, decoder.ends = self._spawn(decoder.spec, decoder.stop)
                decoder.restart_at, decoder.started_at = None, now
                self._states.set(decoder.spec.camera, "starting")
            return
        remove_segments(self._keys.prefix, host=self._host, pids=[process.pid])  # its ring
        if process.exitcode == 0:
            decoder.finished = True
            return
        # Died without its end entry (segfault, OOM kill...): say so, and restart live cameras.
        camera, code = decoder.spec.camera, process.exitcode
        message = f"decoder process for camera {camera!r} died (exit code {code})"
        EventLog(self._client, self._keys).emit(camera, "crashed", message)
        # a camera, or a clip looped like one, comes back; a finite file job does not (its
        # frames would be decoded again)
        end = dead_session_end(self._client, self._keys, camera, message)
        self._client.xadd(self._keys.frames(camera), end)
        self._keep_end(camera, end)
        restart = decoder.spec.live or decoder.spec.loop
        if restart and not self._until_done and not decoder.removing:
            decoder.restarts += 1
            delay = min(2.0**decoder.restarts, RESTART_BACKOFF_MAX_S)
            decoder.restart_at = now + delay
            self._states.set(camera, "restarting")
        else:
            decoder.finished = True
