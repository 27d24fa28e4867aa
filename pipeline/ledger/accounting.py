"""Frame accounting: every decoded frame is processed or dropped with a cause, and counted.

Shared by the batcher's reader and publisher threads, hence the lock.  Overflow drops (frames a
live camera's capped stream trimmed before the batcher read them) are found from gaps in
``seq``; decode errors come from the decoder's end-of-stream entry.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pipeline.ledger.summary import CameraSummary, RunSummary, percentile
from pipeline.telemetry import NO_TELEMETRY, Telemetry
from streams.messages import CameraPosition, LedgerEntry

LATENCY_SAMPLES = 200_000  # bounded memory in a long-running daemon


@dataclass
class _CameraState:
    session: str | None = None  # the decoder session now being received ("" before sessions)
    last_seq: int = -1  # in the current decoder session
    next_seq: int = 0  # the seq that just arrived (or the session's frame count, at its end)
    earlier_sessions: int = 0  # frames decoded by sessions that ended or restarted
    decode_errors: int = 0  # frames lost in decoding: part of decoded, dropped as decode_error
    decoded: int = 0
    previous_run: int = 0  # frames an earlier run left behind: acknowledged, not this run's
    handed_over: int = 0  # of decoded: received by the worker that read the camera before
    redis_down_seen: int = 0  # the session's count of frames shed while Redis was away
    sampled_out: int = 0  # decoded, not taken (vid_stride, max_fps): outside decoded
    redis_lost: bool = False  # Redis lost its data: the next gap is that, not overflow
    received: int = 0
    processed: int = 0
    shed: int = 0  # received, then dropped by the batching policy
    dropped: Counter[str] = field(default_factory=Counter)
    ended: bool = False
    ends: int = 0  # end entries read: one per decoder session, whatever ended it
    ended_sessions: set[str] = field(default_factory=set)  # their sessions (when they had one)
    end_reason: str = ""
    end_error: str = ""
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    queue_delays: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))


class Accounting:
    """Thread-safe counters for one run of the batcher."""

    def __init__(
        self,
        cameras: list[str],
        *,
        max_batch_size: int = 1,
        telemetry: Telemetry = NO_TELEMETRY,
        clock=time.time,
    ):
        """``telemetry`` hears of every frame counted here, as it is counted."""
        self._max_batch_size = max_batch_size
        self._telemetry = telemetry
        self._lock = threading.Lock()
        self._clock = clock
        self._cameras = {camera: _CameraState() for camera in cameras}
        self._batch_sizes: Counter[int] = Counter()
        self._redis_losses = 0  # times Redis was found to have lost its data
        self._started = clock()
        self._first_published: float | None = None
        self._last_published: float | None = None

    def _state(self, camera: str) -> _CameraState:
        return self._cameras.setdefault(camera, _CameraState())

    @staticmethod
    def _enter_session(state: _CameraState, session: str) -> None:
        """Frames of another decoder session: the one before ended (or died) at ``last_seq``."""
        state.earlier_sessions += state.last_seq + 1
        state.last_seq = -1
        state.session = session
        state.redis_down_seen = 0
        if session and state.ended:  # a restarted decoder: the camera runs again
            state.ended, state.end_reason, state.end_error = False, "", ""

    def _drop(
        self, state: _CameraState, camera: str, cause: str, first_seq: int, count: int
    ) -> LedgerEntry:
        state.dropped[cause] += count
        self._telemetry.frames_dropped(camera, cause, count)
        return LedgerEntry(
            camera, state.session or "", "drop", first_seq, count, cause, self._clock()
        )

    def _gap(self, state: _CameraState, camera: str, redis_down: int) -> list[LedgerEntry]:
        """The frames between the last seq seen and the next one never reached the batcher:
        those its decoder shed while Redis was away (its running count went up), then, at the
        first frame after Redis came back empty, those it lost, else those a capped stream
        trimmed.  Which seqs of a gap had which cause is not known, only how many: the
        ledger gives the first ones to redis_down."""
        missing = state.next_seq - state.last_seq - 1
        shed = max(0, min(missing, redis_down - state.redis_down_seen))
        state.redis_down_seen = max(state.redis_down_seen, redis_down)
        lost, state.redis_lost = state.redis_lost, False
        entries = []
        first = state.last_seq + 1
        if shed > 0:
            entries.append(self._drop(state, camera, "redis_down", first, shed))
        if missing > shed:
            cause = "redis_lost" if lost else "overflow"
            entries.append(self._drop(state, camera, cause, first + shed, missing - shed))
        return entries

    def on_received(
        self, camera: str, seq: int, session: str = "", redis_down: int = 0
    ) -> list[LedgerEntry] | None:
        """A frame of ``session`` (its decoder's id; "" from decoders before sessions, whose
        restarts show only as ``seq`` going back); ``redis_down`` is the session's count of
        frames shed while Redis was away.  Returns the drops its arrival revealed, or None
        for a frame of this session seen already (an XADD retried after a lost reply):
        not to be processed or counted again."""
        with self._lock:
            state = self._state(camera)
            if session:
                if session != state.session:
                    self._enter_session(state, session)
                elif seq <= state.last_seq:
                    return None
            # seq went back (to 0, or below the last one): a restarted decoder's new session;
            # the same non-zero seq again is a redelivery, neither a restart nor a drop
            elif seq < state.last_seq or (seq == 0 and state.last_seq >= 0):
                self._enter_session(state, "")
            state.next_seq = seq
            entries = self._gap(state, camera, redis_down)
            state.last_seq = max(seq, state.last_seq)
            state.decoded = state.earlier_sessions + state.last_seq + 1 + state.decode_errors
            state.received += 1
            self._telemetry.frames_received(camera, 1)
            return entries

    def position(self, camera: str) -> CameraPosition:
        """How far the camera is accounted for at receipt (kept in Redis for the next worker
        to read it)."""
        with self._lock:
            state = self._state(camera)
            return CameraPosition(state.session, state.last_seq, state.redis_down_seen, state.ended)

    def adopt(self, camera: str, position: CameraPosition) -> None:
        """Take over a camera another worker read up to ``position``: its frames up to there
        were received (or their drops written) by that worker, so the next seq follows on from
        it.  They count as ``handed_over``, outside this worker's decoded frames, except those
        the other worker left unfinished, which come back through :meth:`on_claimed`.  A
        camera this worker read before, and handed over, follows on in the same way from
        where the other worker left it, or, where this worker is past the position (what it
        wrote after it was refused: another worker held the lease), from the position."""
        with self._lock:
            state = self._state(camera)
            if position.session is None:
                return  # no worker received a frame of it yet
            if state.session == position.session and state.last_seq == position.last_seq:
                return  # this worker is as far: nobody read it since
            if state.session is not None and state.session != position.session:
                # the rest of the session this worker saw went to the other worker
                state.earlier_sessions += state.last_seq + 1
                state.last_seq = -1
            elif state.last_seq > position.last_seq:
                # what this worker read past the position was refused in Redis (another
                # worker held the lease then): those frames are read again from there, and
                # count twice in this worker's own figures (once as read then, once again),
                # which so still add up; Redis, which the audit reads, has them once
                state.earlier_sessions += state.last_seq - position.last_seq
                state.last_seq = position.last_seq
            state.session = position.session
            state.handed_over += position.last_seq - state.last_seq
            state.last_seq = position.last_seq
            state.redis_down_seen = position.redis_down_seen
            state.ended = position.ended
            state.decoded = state.earlier_sessions + state.last_seq + 1 + state.decode_errors

    def would_gap(self, camera: str, session: str, next_seq: int) -> bool:
        """Whether a frame ``next_seq`` of ``session`` (or the session's end with that many
        frames) would show frames missing before it; any other session's first frame, too:
        the end of the one before it, or whole short sessions, may be pending unread on a
        consumer, and no ``seq`` would show it.  That holds for the first session this worker
        sees of the camera as well: the sessions before it may have gone in a reply set aside
        (one per camera and session: a look at what is pending, not at every frame)."""
        with self._lock:
            state = self._state(camera)
            if session != state.session:
                return next_seq > 0 or bool(session)
            return next_seq > state.last_seq + 1

    def on_claimed(self, camera: str) -> None:
        """A frame the camera's previous worker received and never finished: this worker's
        to process now (its seq is accounted for already)."""
        with self._lock:
            state = self._state(camera)
            state.handed_over -= 1
            state.received += 1
            self._telemetry.frames_received(camera, 1)

    def hand_over(self, camera: str, frames: Sequence[tuple[str, int]]) -> None:
        """``frames`` (session, seq) received and not finished go to the worker that took the
        camera over (they stay pending for it to claim).

        A camera's waiting frames are the newest it received (its queue is first in, first
        out): where they are the current session's last seqs, they count as never received
        here, so that, should this worker take the camera back before anyone processed them,
        they are new frames to it again rather than repeats acknowledged unprocessed (an
        adopted position behind this worker's own would be taken for "nobody read it
        since")."""
        with self._lock:
            state = self._state(camera)
            state.received -= len(frames)
            seqs = sorted(seq for session, seq in frames if session == (state.session or ""))
            tail = list(range(state.last_seq - len(frames) + 1, state.last_seq + 1))
            if frames and seqs == tail:
                state.last_seq = seqs[0] - 1
                state.decoded = state.earlier_sessions + state.last_seq + 1 + state.decode_errors
            else:
                state.handed_over += len(frames)

    def on_end(
        self,
        camera: str,
        frames: int,
        reason: str,
        error: str,
        decode_errors: int,
        session: str = "",
        redis_down: int = 0,
        sampled_out: int = 0,
    ) -> list[LedgerEntry]:
        """The end of a decoder session: ``frames`` decoded (-1: unknown, it died), and
        ``decode_errors`` more lost in decoding, which count as decoded and dropped
        (``sampled_out`` more were not taken, counted apart).  Returns the ledger entries:
        drops it revealed, then the session's end."""
        with self._lock:
            state = self._state(camera)
            state.sampled_out += sampled_out
            if session and session != state.session:
                self._enter_session(state, session)  # none of its frames were read
            # the newest frames were trimmed (or shed, or lost) before the batcher read them
            state.next_seq = frames
            entries = self._gap(state, camera, redis_down)
            if decode_errors:
                entries.append(self._drop(state, camera, "decode_error", -1, decode_errors))
                state.decode_errors += decode_errors
            entries.append(
                LedgerEntry(camera, state.session or "", "end", -1, frames, reason, self._clock())
            )
            state.earlier_sessions += max(frames, state.last_seq + 1)
            state.last_seq, state.session = -1, None
            state.decoded = state.earlier_sessions + state.decode_errors
            state.ended, state.end_reason, state.end_error = True, reason, error
            state.ends += 1
            if session:
                state.ended_sessions.add(session)
            return entries

    def on_redis_lost(self, cameras: list[str]) -> None:
        """Redis came back without its data: the frames it held unread show up as the next gap
        of each camera, counted as ``redis_lost``."""
        with self._lock:
            self._redis_losses += 1
            for camera in cameras:
                self._state(camera).redis_lost = True

    def redis_losses(self) -> int:
        """How many times a reader found Redis without its data (the supervisor then writes
        again the end entries of decoder sessions it knows ended, which went with it)."""
        with self._lock:
            return self._redis_losses

    def session_ended(self, camera: str, session: str) -> bool:
        """Whether the end entry of this decoder session has been read."""
        with self._lock:
            return session in self._state(camera).ended_sessions

    def on_previous_run(
        self,
        camera: str,
        session: str = "",
        first_seq: int = -1,
        count: int = 1,
        cause: str = "previous_run",
    ) -> LedgerEntry:
        """Frames an earlier run decoded and this run does not process (left in a stream, or
        found missing before those: ``cause`` says which): counted apart, in neither this
        run's decoded nor its dropped frames."""
        with self._lock:
            self._state(camera).previous_run += count
            self._telemetry.frames_dropped(camera, "previous_run", count)
        return LedgerEntry(camera, session, "drop", first_seq, count, cause, self._clock())

    def on_shed(self, camera: str, cause: str, session: str = "", seq: int = -1) -> LedgerEntry:
        """A received frame dropped before inference (batching policy, transport)."""
        with self._lock:
            state = self._state(camera)
            state.dropped[cause] += 1
            state.shed += 1
            self._telemetry.frames_dropped(camera, cause, 1)
        return LedgerEntry(camera, session, "drop", seq, 1, cause, self._clock())

    def on_published(self, batch: list[tuple[str, float, float]], published: float) -> None:
        """A batch's frames are in Redis: ``(camera, latency_s, queue_delay_s)`` for each."""
        with self._lock:
            self._batch_sizes[len(batch)] += 1
            for camera, latency, queue_delay in batch:
                state = self._state(camera)
                state.processed += 1
                state.latencies.append(latency)
                state.queue_delays.append(queue_delay)
                self._telemetry.frames_published(camera, latency, queue_delay)
            if self._first_published is None:
                self._first_published = published
            self._last_published = published

    def outstanding(self, camera: str) -> int:
        """Frames received and not yet published (nor dropped after receipt)."""
        with self._lock:
            state = self._state(camera)
            return state.received - state.processed - state.shed

    def track(self, camera: str) -> None:
        """A camera added while running: in the summary from now on, frames or not."""
        with self._lock:
            self._state(camera)

    def processed_counts(self) -> dict[str, int]:
        with self._lock:
            return {camera: state.processed for camera, state in self._cameras.items()}

    def decoded_counts(self) -> dict[str, int]:
        """Frames decoded so far by each camera's decoder sessions (as ``summary``)."""
        with self._lock:
            return {camera: state.decoded for camera, state in self._cameras.items()}

    def end_count(self, camera: str) -> int:
        """End entries read for this camera (each decoder session writes one, or the
        supervisor for one that died)."""
        with self._lock:
            return self._state(camera).ends

    def ended(self, cameras: list[str]) -> bool:
        """Whether each of these cameras has sent its end-of-stream entry."""
        with self._lock:
            return all(self._state(camera).ended for camera in cameras)

    def all_ended(self) -> bool:
        with self._lock:
            return all(state.ended for state in self._cameras.values())

    def all_done(self) -> bool:
        """Every camera ended and every frame it delivered is published."""
        with self._lock:
            return all(
                state.ended and state.received == state.processed + state.shed
                for state in self._cameras.values()
            )

    def summary(self, recent: int | None = None) -> RunSummary:
        """The run so far; latency percentiles over each camera's last ``recent`` frames
        (all kept samples when None). Samples are copied under the lock and sorted after it,
        so a summary asked for while running never holds up the batcher."""
        with self._lock:
            finished = self._clock()
            states = []
            for camera, state in sorted(self._cameras.items()):
                latencies, delays = (
                    _last(state.latencies, recent),
                    _last(state.queue_delays, recent),
                )
                states.append(
                    (camera, replace(state, dropped=Counter(state.dropped)), latencies, delays)
                )
            batch_sizes = dict(sorted(self._batch_sizes.items()))
            first_published, last_published = self._first_published, self._last_published
        cameras = []
        all_latencies: list[float] = []
        all_delays: list[float] = []
        for camera, state, latencies, delays in states:
            latencies.sort()
            all_latencies.extend(latencies)
            all_delays.extend(delays)
            cameras.append(
                CameraSummary(
                    camera=camera,
                    decoded=state.decoded - state.handed_over,
                    processed=state.processed,
                    handed_over=state.handed_over,
                    previous_run=state.previous_run,
                    sampled_out=state.sampled_out,
                    dropped=dict(state.dropped),
                    end_reason=state.end_reason,
                    error=state.end_error,
                    latency_p50_s=percentile(latencies, 50),
                    latency_p99_s=percentile(latencies, 99),
                )
            )
        all_latencies.sort()
        all_delays.sort()
        batches = sum(batch_sizes.values())
        frames = sum(size * count for size, count in batch_sizes.items())
        return RunSummary(
            cameras=tuple(cameras),
            batches=batches,
            batch_sizes=batch_sizes,
            mean_batch_size=frames / batches if batches else 0.0,
            batch_fill_ratio=frames / batches / self._max_batch_size if batches else 0.0,
            queue_delay_p50_s=percentile(all_delays, 50),
            queue_delay_p99_s=percentile(all_delays, 99),
            wall_s=finished - self._started,
            processing_s=(last_published or finished) - (first_published or finished),
            latency_p50_s=percentile(all_latencies, 50),
            latency_p90_s=percentile(all_latencies, 90),
            latency_p99_s=percentile(all_latencies, 99),
        )


def _last(samples: deque[float], count: int | None) -> list[float]:
    """The newest ``count`` samples (all when None), as a new list."""
    if count is None or count >= len(samples):
        return list(samples)
    return list(itertools.islice(samples, len(samples) - count, None))
