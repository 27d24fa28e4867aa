"""The decoder supervisor: a decoder thread per camera, several cameras to a decode process
(:mod:`pipeline.supervisor.decoder_processes`), restarted with backoff when a live camera's
fails or its process dies, each stopped on its own (a camera removed live) or all together.
Under a decode worker's leases (``framebatch decode``, :mod:`pipeline.fleet.sharded`) the
cameras are started and stopped by the leases, every decoder's writes are fenced
(:mod:`streams.fence`), and a decoder fenced out ends without a word more: its session is the
worker's that took the camera over.

A decoder that ends without its end entry (an exception in its thread; its process
segfaulted or was OOM-killed, taking its other cameras too) gets one written here from the
progress it kept, so every session of every camera ends in the frames stream.  Every session's
end entry is also kept here until it has been read: Redis restarting without its data can take
an end entry with it (a file camera's decoder that finished before the restart), and the run
would wait for it for ever; after such a loss the lost ones are written again.  With the shm
transport a decoder's ring outlives it until its frames are read; the rings of decoders that
died are removed here.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace

import redis

from pipeline.config import CameraConfig, Config
from pipeline.supervisor.builders import (
    decode_threads,
    decoder_spec,
    frame_letterbox,
    transport_spec,
)
from pipeline.supervisor.decoder_processes import DecoderProcesses
from pipeline.supervisor.part import Part
from pipeline.supervisor.services import Services
from streams.decode_process import DecoderJob, Message, ProcessSettings
from streams.decode_worker import DecoderSpec, ProcessFlag
from streams.events import EventLog
from streams.fence import (
    LEASE_LOST,
    DecodeLease,
    SessionClaim,
    claim_sessions,
    end_session_in_progress,
)
from streams.keys import StreamKeys
from streams.messages import EndOfStream, message_kind, new_session_id, session_progress
from streams.redis_errors import OUTAGE_ERRORS
from streams.shm_ring import remove_segments
from streams.transport import host_id

log = logging.getLogger(__name__)

DECODER_JOIN_S = 5.0
RESTART_BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0  # a decoder up this long has recovered: its restart backoff resets
LEASE_LOST_MESSAGE = (
    "another decode worker took this camera over (this one was cut off or stalled past its "
    "lease); its decoder here stopped, and that worker ended the session"
)


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
    removing: bool = False  # removed through the API, or handed over: drains, never restarts
    lost: bool = False  # its lease went to another decode worker: stops, writes nothing more
    session: str | None = None  # the current run's, claimed under the lease
    ended: bool = False  # the current run sent its end entry (its ring may still be read)
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
        lease: DecodeLease | None = None,
    ):
        """``rings_read_here``: this process's detector workers read the decoders' shm rings,
        which may go once those workers have stopped (``close``); otherwise (split roles) a
        decoder keeps its ring until its stream is read, or nobody read it for a while.
        ``lease``: the cameras are decoded under this decode worker's leases
        (``pipeline.fleet.sharded``), every write fenced, the cameras started and stopped by
        the leases (``launch`` is not called)."""
        self._config = config
        self._lease = lease
        self._client = services.client
        self._keys = services.keys
        self._accounting = services.accounting
        self._states = services.states
        self._until_done = until_done
        self._decoders: dict[str, _Decoder] = {}
        self._sessions: dict[str, int] = {}  # decoders started per camera (each a session)
        self._stopping = False  # no restarts from here on
        self._host = host_id()
        self._released = ProcessFlag() if rings_read_here else None
        self._redis_url = services.redis_url
        self._processes = DecoderProcesses(
            # a decoder dies with this process, however it ends; -v reaches the decoders
            ProcessSettings(os.getpid(), logging.getLogger().getEffectiveLevel()),
            self._released,
            config.decoding.cameras_per_process,
        )
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
        self._reap(now)
        for decoder in self._decoders.values():
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
        self._processes.stop_all()

    def close(self) -> None:
        """After the detector workers stopped: rings released, decode processes joined (stop →
        join → terminate → kill: none is left behind), the rings of any killed on the way
        removed."""
        if self._released is not None:
            self._released.set()
        self._stopping = True
        self._processes.stop_and_join(DECODER_JOIN_S)
        try:
            # a decoder whose start was still in its process's pipe when the process stopped
            # (or killed on the way) wrote no end: its session is ended here, not left open
            self._reap(time.monotonic())
        except OUTAGE_ERRORS as exc:
            log.warning("decoders' sessions not ended (Redis unreachable): %s", exc)
        pids = self._processes.close(DECODER_JOIN_S)
        remove_segments(self._keys.prefix, host=self._host, pids=pids)

    def _reap(self, now: float) -> None:
        """What the decode processes said, and those that exited: the sessions of decoders
        that exited without their end entry ended from their progress."""
        for message in self._processes.messages():
            self._received(message)
        for process, last, cameras in self._processes.dead():
            for message in last:
                self._received(message)
            remove_segments(self._keys.prefix, host=self._host, pids=[process.pid])  # rings
            code = process.process.exitcode
            for camera, run in cameras:
                if run != self._sessions[camera]:
                    continue  # a thread of a camera removed and back: the camera runs on
                if self._decoders[camera].ended:  # its session ended; the process died after
                    self._decoders[camera].finished = True
                    continue
                how = f"died (exit code {code})" if code else "stopped before the decoder began"
                self._ended_without_entry(
                    self._decoders[camera], f"decoder process for camera {camera!r} {how}", now
                )

    # --- cameras --------------------------------------------------------------------------------
    def add(self, camera: CameraConfig) -> None:
        """Start the camera's decoder (a camera removed before may come back under its id)."""
        self.add_all([camera])

    def add_all(self, cameras: list[CameraConfig]) -> None:
        """:meth:`add` for many cameras, their sessions claimed together (a decode worker taking
        over a lost host's cameras)."""
        specs = []
        for camera in cameras:
            self._camera_ids.add(camera.id)
        for camera in cameras:
            spec = decoder_spec(
                camera,
                default_backlog=self._config.redis.frames_maxlen,
                until_done=self._until_done,
                decode_threads=decode_threads(self._config, len(self._camera_ids)),
                # a live camera keeps at most one batch waiting in its stream: beyond that the
                # pipeline is behind, and older frames would only raise the latency
                live_backlog=self._config.batching.max_batch_size,
            )
            spec = replace(spec, lease=self._lease)
            self._decoders[camera.id] = _Decoder(spec)  # or a camera removed before, back
            specs.append(spec)
        self._start(specs)

    def remove(self, camera: str) -> None:
        """Stop the camera's decoder for good; one that hangs is killed after a while."""
        decoder = self._decoders[camera]
        decoder.removing = True
        if decoder.restart_at is not None:  # dead, its end entry written: not restarted
            decoder.restart_at, decoder.finished = None, True
        self._processes.stop_camera(camera)
        # a read blocked on a stalled camera returns at its timeout
        decoder.kill_at = time.monotonic() + DECODER_JOIN_S + decoder.spec.read_timeout_s

    def abandon(self, camera: str) -> None:
        """The camera's lease went to another decode worker: its decoder stops, writing nothing
        more (its writes are fenced; its session is the new holder's to end), never restarted."""
        decoder = self._decoders[camera]
        decoder.lost = True
        if decoder.restart_at is not None:
            decoder.restart_at, decoder.finished = None, True
        self._processes.stop_camera(camera)
        decoder.kill_at = time.monotonic() + DECODER_JOIN_S + decoder.spec.read_timeout_s

    def known(self, camera: str) -> bool:
        return camera in self._decoders

    def decoding_cameras(self) -> list[str]:
        """The cameras :meth:`decoding` here."""
        return sorted(camera for camera in self._decoders if self.decoding(camera))

    def decoding(self, camera: str) -> bool:
        """The camera has a decoder here that runs, or will run again (a restart due), and is
        not being stopped."""
        decoder = self._decoders.get(camera)
        return decoder is not None and not (decoder.finished or decoder.removing or decoder.lost)

    def running(self, camera: str) -> bool:
        """The camera's decoder (thread, or process) has not exited."""
        return self._processes.running(camera)

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
        """The camera's decoder has exited (its thread, or its process), and every session it
        started has its end entry read by the accounting (not only an earlier one's: a
        restart, a re-added id)."""
        if self._processes.running(camera):
            return False
        return self._accounting.end_count(camera) >= self._sessions.get(camera, 0)

    # --- inside -------------------------------------------------------------------------------
    def _job(self, spec: DecoderSpec) -> DecoderJob:
        return DecoderJob(
            run=self._sessions[spec.camera],
            session=self._decoders[spec.camera].session,
            spec=spec,
            redis_url=self._redis_url,
            prefix=self._keys.prefix,
            prepare=self._letterbox,
            transport=self._transport,
            cluster=self._config.redis.cluster,
            reconnect_timeout_s=self._config.redis.reconnect_timeout_s,
            max_frame_bytes=self._letterbox.max_bytes,
        )

    def _start(self, specs: list[DecoderSpec]) -> None:
        """Starts a decoder for a new session of each (under a lease: claimed first, all in one
        round trip, else not started, and the camera left to the leases)."""
        claims = []
        for spec in specs:
            if spec.lease is not None:
                session = self._decoders[spec.camera].session = new_session_id()
                claims.append(SessionClaim(spec.camera, session, spec.file_job))
        claimed = {}
        if claims and self._lease is not None:
            claimed = claim_sessions(self._client, self._keys, self._lease, claims)
        for spec in specs:
            decoder = self._decoders[spec.camera]
            if spec.lease is not None and not claimed[spec.camera]:
                decoder.lost = decoder.finished = True
                continue
            self._sessions[spec.camera] = self._sessions.get(spec.camera, 0) + 1  # each ends once
            decoder.ended = False
            self._processes.start(self._job(spec))

    def _received(self, message: Message) -> None:
        """A decoder's session ended (its end entry, kept until read), or its thread exited:
        cleanly (finished), or failing without its end entry."""
        kind, camera, run, detail = message
        if kind == "end":
            self._keep_end(camera, detail)
            if run == self._sessions.get(camera):
                self._decoders[camera].ended = True
        elif kind == "exited" and run == self._sessions.get(camera):  # not one before it
            decoder = self._decoders[camera]
            if detail == LEASE_LOST:  # its session was ended by the worker that took it over
                decoder.lost = decoder.finished = True
                EventLog(self._client, self._keys).emit(camera, "lease_lost", LEASE_LOST_MESSAGE)
            elif detail is None:
                decoder.finished = True
            else:
                message = f"decoder for camera {camera!r} failed: {detail}"
                self._ended_without_entry(decoder, message, time.monotonic())

    def keep_end(self, camera: str, fields: dict[str, str | int]) -> None:
        """An end entry written for one of this camera's sessions elsewhere (a decode worker
        lost, ended by the one that took its camera), kept like its own until read."""
        self._keep_end(camera, fields)

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
        camera = decoder.spec.camera
        if self._processes.running(camera):
            if decoder.restarts and now - decoder.started_at >= HEALTHY_AFTER_S:
                decoder.restarts = 0  # a crash after a healthy spell starts at 1 s again
            if decoder.kill_at is not None and now >= decoder.kill_at and not decoder.ended:
                # its sessions end once found dead
                if self._processes.kill_process_of(camera, now):
                    decoder.kill_at = None
            return
        if decoder.restart_at is not None and now >= decoder.restart_at and not self._stopping:
            # (a decoder abandoned or removed has no restart due)
            self._start([decoder.spec])
            decoder.restart_at, decoder.started_at = None, now
            self._states.set(camera, "starting")

    def _end_session(self, decoder: _Decoder, message: str) -> dict[str, str | int] | None:
        """The end entry of a session whose decoder died, written from its progress; under a
        lease, only that session's, only while it is still in progress and the lease this
        worker's (else the worker that took the camera over ended it), a file job then
        decoded."""
        spec = decoder.spec
        camera = spec.camera
        if spec.lease is None:
            end = dead_session_end(self._client, self._keys, camera, message)
            self._client.xadd(self._keys.frames(camera), end)
            return end
        if decoder.lost or decoder.session is None:
            return None
        ended = end_session_in_progress(
            self._client,
            self._keys,
            camera,
            spec.lease,
            message,
            final=spec.file_job,
            session=decoder.session,
        )
        return None if ended is None else ended.to_fields()

    def _ended_without_entry(self, decoder: _Decoder, message: str, now: float) -> None:
        """Say so, write the session's end from its progress, and restart live cameras."""
        camera = decoder.spec.camera
        if decoder.lost:  # abandoned, then killed: its session is the new holder's to end
            decoder.finished = True
            return
        EventLog(self._client, self._keys).emit(camera, "crashed", message)
        end = self._end_session(decoder, message)
        if end is not None:
            self._keep_end(camera, end)
        # a camera, or a clip looped like one, comes back; a finite file job does not (its
        # frames would be decoded again)
        restart = not decoder.spec.file_job and not (decoder.removing or decoder.lost)
        if restart and not self._until_done and not self._stopping:
            decoder.restarts += 1
            delay = min(2.0**decoder.restarts, RESTART_BACKOFF_MAX_S)
            decoder.restart_at = now + delay
            self._states.set(camera, "restarting")
        else:
            decoder.finished = True
