"""Discrete-event simulation of the batcher: simulated cameras → the daemon's policy → one detector.

``simulate`` drives the very policy objects the daemon builds (``pipeline.batching.make_policy``)
over a simulated clock: no Redis, no threads, no sleeps.  Events sit in a heap:

* a camera's frame arriving at the batcher (each camera: fps, arrival jitter, stalls that
  deliver ``burst_frames`` at once, join/leave times, priority, freshness deadline);
* the detector finishing a batch (service time from a
  :class:`~framebatch_tools.simulate.profiles.ServiceProfile`);
* the policy's ``wake_at``.

The policy is polled after every arrival, every completion and at ``wake_at``, with
``idle=True`` only while the detector is free (one detector, one batch at a time), and told each
batch's service time through ``observe``, as ``BatchWorker`` does.  A frame's latency is its
completion time minus its capture time; a frame reaches the batcher ``transport_s`` after
capture, plus jitter, plus any stall.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from framebatch_tools.simulate.profiles import PROFILES, ServiceProfile
from pipeline.batching import CameraRules, make_policy, queue_bound

_ARRIVAL, _DONE, _WAKE = 0, 1, 2
DROP_CAUSES = ("stale", "overflow", "superseded")


@dataclass(frozen=True)
class SimCamera:
    """One simulated camera."""

    id: str
    fps: float
    priority: int = 1  # 0 is served first and shed last
    jitter: float = 0.0  # extra arrival delay, uniform in [0, jitter) frame intervals (<= 1)
    burst_frames: int = 1  # a stall holds this many frames and delivers them at once
    burst_every_s: float = 0.0  # how often a stall happens (0: never)
    burst_offset_s: float = 0.0  # when the first stall starts after join_s (cameras differ)
    join_s: float = 0.0  # first capture no earlier than this
    leave_s: float = math.inf  # no capture from this time on
    max_frame_age_ms: float | None = None  # freshness deadline from capture (live cameras)
    phase_s: float = 0.0  # offset of the first capture after join_s


@dataclass(frozen=True)
class SimSettings:
    """The policy under test and the run's length; policy fields mirror ``BatchingConfig``
    (``policy_options``: the policy's own settings, ``{"latency_target_ms": 50}`` for aimd)."""

    policy: str
    max_batch_size: int = 8
    max_wait_ms: float = 50.0
    max_wait_frames: float | None = 2.0
    preferred_batch_sizes: tuple[int, ...] = ()
    # None: the daemon's default bound (queue_bound); set: exactly this many frames
    max_queue_frames: int | None = None
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    transport_s: float = 0.0  # constant capture-to-batcher delay
    warmup_s: float = 2.0  # nothing before this is measured
    duration_s: float = 20.0  # measured time after the warm-up
    seed: int = 0


@dataclass
class SimResult:
    """What one run measured over ``[warmup, warmup + duration)``; ``total_*`` cover the run."""

    policy: str
    cameras: int
    offered_fps: float  # frames/s that reached the batcher in the window
    hp_offered_fps: float  # of which from priority-0 cameras
    throughput_fps: float  # frames/s completed in the window
    p50_ms: float
    p99_ms: float
    batcher_p99_ms: float  # from arrival at the batcher (what the policy controls)
    hp_p99_ms: float  # priority-0 cameras only
    p99_first_half_ms: float  # by completion time, for the queue-growth check
    p99_second_half_ms: float
    mean_batch: float
    drop_rate: float  # dropped / arrived in the window
    drop_stale: float  # per cause, as fractions of arrived
    drop_overflow: float
    drop_superseded: float
    hp_drop_rate: float
    max_waiting: int  # most frames waiting in the policy's queues
    queue_bound: int  # the policy's max_waiting
    utilisation: float  # detector busy fraction
    batches: int
    decisions: int  # add + poll calls over the whole run
    policy_s: float  # CPU seconds spent inside the policy over the whole run
    add_s: float  # of which in add()
    polls: int  # poll() calls over the whole run
    total_offered: int
    total_completed: int
    total_dropped: int
    left_waiting: int  # still queued at the end
    left_in_flight: int  # in the detector at the end
    drops_by_cause: dict[str, int] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """Flat fields for a CSV row."""
        row = asdict(self)
        row.pop("drops_by_cause")
        return row


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if len(values) else math.nan


def simulate(
    cameras: Sequence[SimCamera], profile: ServiceProfile, settings: SimSettings
) -> SimResult:
    """Run one simulation; deterministic for a given seed."""
    arrivals_rng = random.Random(f"{settings.seed}/arrivals")
    service_rng = random.Random(f"{settings.seed}/service")
    policy = make_policy(
        settings.policy,
        max_batch_size=settings.max_batch_size,
        max_wait_ms=settings.max_wait_ms,
        preferred_batch_sizes=settings.preferred_batch_sizes,
        max_queue_frames=settings.max_queue_frames
        or queue_bound(settings.max_batch_size, len(cameras)),
        camera_rules={
            c.id: CameraRules(
                priority=c.priority,
                max_wait_frames=settings.max_wait_frames,
                max_wait_ms=settings.max_wait_ms,
                max_frame_age_ms=c.max_frame_age_ms,
            )
            for c in cameras
        },
        options=settings.policy_options,
    )
    start, end = settings.warmup_s, settings.warmup_s + settings.duration_s
    half = start + settings.duration_s / 2

    events: list[tuple[float, int, int, int]] = []  # (time, tiebreak, kind, camera index)
    tiebreak = 0
    next_seq = [0] * len(cameras)
    last_arrival = [-math.inf] * len(cameras)

    def schedule_frame(index: int) -> None:
        """Push the camera's next frame (capture time known from its sequence number)."""
        nonlocal tiebreak
        cam = cameras[index]
        interval = 1.0 / cam.fps
        captured = cam.join_s + cam.phase_s + next_seq[index] * interval
        if captured >= cam.leave_s or captured >= end:
            return
        arrival = captured + settings.transport_s + cam.jitter * interval * arrivals_rng.random()
        if cam.burst_frames > 1 and cam.burst_every_s > 0:
            since = captured - cam.join_s - cam.burst_offset_s
            stall = cam.join_s + cam.burst_offset_s + since // cam.burst_every_s * cam.burst_every_s
            release = stall + (cam.burst_frames - 1) * interval
            if since >= 0 and captured < release:  # held by the stall, released together
                arrival = max(arrival, release + settings.transport_s)
        arrival = max(arrival, last_arrival[index])  # each camera's frames arrive in order
        last_arrival[index] = arrival
        tiebreak += 1
        heapq.heappush(events, (arrival, tiebreak, _ARRIVAL, index))

    for index in range(len(cameras)):
        schedule_frame(index)

    busy = False
    in_flight: list[Any] = []
    in_flight_started = 0.0
    pending_wake = math.inf
    latencies: list[float] = []
    latencies_hp: list[float] = []
    batcher_latencies: list[float] = []
    first_half: list[float] = []
    second_half: list[float] = []
    batch_sizes: list[int] = []
    busy_s = 0.0
    drops: Counter[str] = Counter()
    total_drops: Counter[str] = Counter()
    hp_dropped = arrived = hp_arrived = total_offered = total_completed = 0
    max_waiting = decisions = 0
    policy_s = add_s = 0.0
    polls = 0
    clock = time.perf_counter

    def count_drops(dropped: list, now: float) -> None:
        nonlocal hp_dropped
        for d in dropped:
            total_drops[d.cause] += 1
            if start <= d.frame.arrived < end:  # charged to the window the frame arrived in
                drops[d.cause] += 1
                hp_dropped += d.frame.item == 0

    def poll(now: float) -> None:
        nonlocal busy, in_flight, in_flight_started, pending_wake, decisions, policy_s, tiebreak
        nonlocal max_waiting, polls
        began = clock()
        decision = policy.poll(now, idle=not busy)
        policy_s += clock() - began
        decisions += 1
        polls += 1
        count_drops(decision.dropped, now)
        max_waiting = max(max_waiting, policy.waiting + len(decision.batch))
        if decision.batch:
            busy, in_flight, in_flight_started = True, decision.batch, now
            tiebreak += 1
            service = profile.sample(len(decision.batch), service_rng)
            heapq.heappush(events, (now + service, tiebreak, _DONE, -1))
        elif not busy and decision.wake_at is not None:
            wake = max(decision.wake_at, now + 1e-9)
            if wake < pending_wake:  # an earlier wake is already due to poll again
                pending_wake = wake
                tiebreak += 1
                heapq.heappush(events, (wake, tiebreak, _WAKE, -1))

    while events:
        now, _, kind, index = heapq.heappop(events)
        if now >= end:
            break
        if kind == _ARRIVAL:
            cam = cameras[index]
            seq = next_seq[index]
            next_seq[index] += 1
            captured = cam.join_s + cam.phase_s + seq * (1.0 / cam.fps)
            total_offered += 1
            if start <= now:
                arrived += 1
                hp_arrived += cam.priority == 0
            began = clock()
            dropped = policy.add(cam.id, seq, captured, cam.priority, now)
            spent = clock() - began
            policy_s += spent
            add_s += spent
            decisions += 1
            count_drops(dropped, now)
            schedule_frame(index)
        elif kind == _DONE:
            seconds = now - in_flight_started
            began = clock()
            policy.observe(len(in_flight), seconds)
            policy_s += clock() - began
            total_completed += len(in_flight)
            if now >= start:
                batch_sizes.append(len(in_flight))
                busy_s += seconds
                for frame in in_flight:
                    latency = now - frame.captured
                    latencies.append(latency)
                    batcher_latencies.append(now - frame.arrived)
                    (first_half if now < half else second_half).append(latency)
                    if frame.item == 0:
                        latencies_hp.append(latency)
            busy, in_flight = False, []
        elif now >= pending_wake:
            pending_wake = math.inf
        poll(now)

    duration = settings.duration_s
    dropped_total = sum(drops.values())
    return SimResult(
        policy=settings.policy,
        cameras=len(cameras),
        offered_fps=arrived / duration,
        hp_offered_fps=hp_arrived / duration,
        throughput_fps=len(latencies) / duration,
        p50_ms=_percentile(latencies, 50),
        p99_ms=_percentile(latencies, 99),
        batcher_p99_ms=_percentile(batcher_latencies, 99),
        hp_p99_ms=_percentile(latencies_hp, 99),
        p99_first_half_ms=_percentile(first_half, 99),
        p99_second_half_ms=_percentile(second_half, 99),
        mean_batch=float(np.mean(batch_sizes)) if batch_sizes else math.nan,
        drop_rate=dropped_total / arrived if arrived else 0.0,
        drop_stale=drops["stale"] / arrived if arrived else 0.0,
        drop_overflow=drops["overflow"] / arrived if arrived else 0.0,
        drop_superseded=drops["superseded"] / arrived if arrived else 0.0,
        hp_drop_rate=hp_dropped / hp_arrived if hp_arrived else 0.0,
        max_waiting=max_waiting,
        queue_bound=policy.queues.max_waiting,
        utilisation=busy_s / duration,
        batches=len(batch_sizes),
        decisions=decisions,
        policy_s=policy_s,
        add_s=add_s,
        polls=polls,
        total_offered=total_offered,
        total_completed=total_completed,
        total_dropped=sum(total_drops.values()),
        left_waiting=policy.waiting,
        left_in_flight=len(in_flight),
        drops_by_cause=dict(total_drops),
    )


@dataclass(frozen=True)
class Mix:
    """How the simulated cameras behave; ``fps`` is cycled over the cameras."""

    name: str
    fps: tuple[float, ...]
    jitter: float = 0.1
    burst_frames: int = 1
    burst_every_s: float = 0.0
    churn: float = 0.0  # fraction of cameras that join late or leave early


def make_cameras(
    mix: Mix, count: int, *, frame_age_ms: float, seed: int, span_s: float
) -> list[SimCamera]:
    """``count`` cameras: every 10th (from the first) at priority 0, all with a deadline."""
    rng = random.Random(f"{seed}/{mix.name}/{count}")
    cameras = []
    for i in range(count):
        fps = mix.fps[i % len(mix.fps)]
        join, leave = 0.0, math.inf
        if i and rng.random() < mix.churn:  # camera 0 stays: something always runs
            if rng.random() < 0.5:
                join = rng.uniform(0.2, 0.5) * span_s
            else:
                leave = rng.uniform(0.5, 0.9) * span_s
        cameras.append(
            SimCamera(
                id=f"cam{i}",
                fps=fps,
                priority=0 if i % 10 == 0 else 1,
                jitter=mix.jitter,
                burst_frames=mix.burst_frames,
                burst_every_s=mix.burst_every_s,
                burst_offset_s=rng.uniform(0, mix.burst_every_s),
                join_s=join,
                leave_s=leave,
                max_frame_age_ms=frame_age_ms,
                phase_s=rng.random() / fps,
            )
        )
    return cameras


# --- the simulator's own cost ----------------------------------------------------------------
def decisions_bench(camera_counts: Sequence[int] = (100, 300, 1000), fps: float = 30.0) -> str:
    """Policy CPU time for N cameras at ``fps`` (adaptive, one core), against the frame rate.

    Each arrival costs one ``add`` and one ``poll`` (the simulator polls after every event; the
    daemon polls once per Redis read, so this is the worst case for ``poll``).  Measured with the
    GPU model (past capacity from ~260 cameras: queues full, every add evicts) and with a
    detector 10x faster than it (never saturated).
    """
    model = PROFILES["gpu_a100_trt_model"]
    fast = replace(model, name="gpu_model_x10", a_s=model.a_s / 10, c_s=model.c_s / 10)
    lines = [
        "adaptive policy, one core; every arrival is add() + poll()",
        f"{'detector':<19} {'cams':>5} {'need fps':>9} {'add us':>7} {'poll us':>8} "
        f"{'frames/s decided':>17} {'ratio':>6}",
    ]
    for profile in (model, fast):
        for count in camera_counts:
            cameras = make_cameras(
                Mix("bench", (fps,)), count, frame_age_ms=model.frame_age_ms, seed=0, span_s=2.0
            )
            settings = SimSettings(
                "adaptive", max_batch_size=profile.max_batch_size, warmup_s=0.5, duration_s=1.0
            )
            r = simulate(cameras, profile, settings)
            decided, need = r.total_offered / r.policy_s, count * fps
            lines.append(
                f"{profile.name:<19} {count:>5} {need:>9.0f} "
                f"{1e6 * r.add_s / r.total_offered:>7.1f} "
                f"{1e6 * (r.policy_s - r.add_s) / r.polls:>8.1f} {decided:>17.0f} "
                f"{decided / need:>6.2f}"
            )
    return "\n".join(lines)
