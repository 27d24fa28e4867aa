"""``framebatch simulate``: the discrete-event simulator over the daemon's own batching policies.

Deterministic (seeded) and fast: simulated clocks only, no Redis, no model, no sleeps.
"""

from __future__ import annotations

import csv
import math

import pytest

from framebatch_tools.simulate.profiles import PROFILES, ServiceProfile, get_profile
from framebatch_tools.simulate.simulator import DROP_CAUSES, SimCamera, SimSettings, simulate
from framebatch_tools.simulate.sweep import (
    Mix,
    check_targets,
    format_table,
    make_cameras,
    plot_sweep,
    run_sweep,
    sweep_points,
    write_csv,
)
from pipeline.batching import POLICIES
from pipeline.cli import build_parser

# a detector without noise: t(b) = 10 ms + 5 ms * b
EXACT = ServiceProfile(name="exact", kind="model", source="test", a_s=0.010, c_s=0.005)


def settings(policy: str, **kwargs) -> SimSettings:
    return SimSettings(policy=policy, **{"warmup_s": 1.0, "duration_s": 5.0, **kwargs})


def close(value_ms: float, expected_s: float) -> bool:
    return math.isclose(value_ms, expected_s * 1000, abs_tol=1e-6)


# --- profiles ------------------------------------------------------------------------------------


def test_gpu_model_passes_through_the_published_point_and_is_labelled_a_model() -> None:
    gpu = get_profile("gpu_a100_trt_model")
    assert gpu.kind == "model" and "not a measurement" in gpu.source
    assert gpu.seconds(1) == pytest.approx(0.00099)  # Ultralytics: 0.99 ms, A100 TensorRT
    assert gpu.capacity(32) > 7 * gpu.capacity(1)  # the assumed batching gain


def test_cpu_profile_has_no_batching_gain() -> None:
    cpu = PROFILES["cpu_ort_2core"]
    assert cpu.kind == "measured"
    assert cpu.capacity(1) == pytest.approx(cpu.capacity(8)) == pytest.approx(1 / 0.066)


@pytest.mark.parametrize(
    ("size", "expected"), [(1, 0.010), (2, 0.016), (3, 0.022), (4, 0.028), (6, 0.040)]
)
def test_measured_table_interpolates_and_extrapolates(size: int, expected: float) -> None:
    table = ServiceProfile(name="t", kind="measured", source="test", table={2: 0.016, 4: 0.028})
    assert table.seconds(size) == pytest.approx(expected if size != 1 else 0.008)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="gpu_a100_trt_model"):
        get_profile("gpu")


# --- single runs ---------------------------------------------------------------------------------


def test_batch1_at_low_load_latency_is_the_service_time() -> None:
    result = simulate([SimCamera("a", fps=10)], EXACT, settings("batch1"))
    assert close(result.p50_ms, EXACT.seconds(1)) and close(result.p99_ms, EXACT.seconds(1))
    assert result.mean_batch == 1 and result.drop_rate == 0
    assert result.throughput_fps == pytest.approx(10, abs=0.2)


def test_static_at_low_load_waits_for_a_full_batch() -> None:
    cameras = [SimCamera("a", fps=10), SimCamera("b", fps=10, phase_s=0.05)]
    result = simulate(cameras, EXACT, settings("static", max_batch_size=4))
    # frames every 50 ms: the first of a batch waits 150 ms for the fourth
    assert result.mean_batch == 4
    assert close(result.p99_ms, 0.150 + EXACT.seconds(4))


def test_timeout_waits_its_timeout_then_dispatches_what_it_has() -> None:
    result = simulate([SimCamera("a", fps=10)], EXACT, settings("timeout", max_wait_ms=20))
    assert close(result.p99_ms, 0.020 + EXACT.seconds(1))


def test_adaptive_at_low_load_stays_within_service_time_plus_window() -> None:
    gpu = PROFILES["gpu_a100_trt_model"]
    cameras = make_cameras(Mix("30fps", (30.0,)), 10, frame_age_ms=200, seed=1, span_s=6)
    result = simulate(cameras, gpu, settings("adaptive", max_batch_size=32))
    window_ms = min(2 / 30 * 1000, 50.0)
    assert result.batcher_p99_ms <= gpu.seconds(1) * gpu.p99_factor() * 1000 + window_ms
    assert result.batcher_p99_ms < 5  # in fact it hardly waits at all
    assert result.drop_rate == 0


def overload_cameras() -> list[SimCamera]:
    """Bursts, joins, leaves, two priorities, deadlines: 1.2x what EXACT serves at batch 8."""
    cameras = []
    for i in range(12):
        cameras.append(
            SimCamera(
                f"c{i}",
                fps=25.0 if i % 2 else 10.0,
                priority=0 if i == 0 else 1,
                jitter=0.3,
                burst_frames=3 if i % 3 == 0 else 1,
                burst_every_s=1.0,
                burst_offset_s=0.1 * i,
                join_s=1.5 if i == 5 else 0.0,
                leave_s=3.0 if i == 7 else math.inf,
                max_frame_age_ms=300.0,
                phase_s=0.003 * i,
            )
        )
    return cameras


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_frame_is_completed_dropped_with_a_cause_or_still_held(policy: str) -> None:
    result = simulate(overload_cameras(), EXACT, settings(policy, max_batch_size=8))
    assert result.total_offered == (
        result.total_completed + result.total_dropped + result.left_waiting + result.left_in_flight
    )
    assert set(result.drops_by_cause) <= set(DROP_CAUSES)
    assert result.max_waiting <= result.queue_bound


def test_overload_sheds_low_priority_first() -> None:
    result = simulate(overload_cameras(), EXACT, settings("adaptive", max_batch_size=8))
    assert result.drop_rate > 0.1 and result.hp_drop_rate == 0
    assert result.hp_p99_ms <= 300.0


def test_cameras_join_and_leave_and_bursts_keep_the_rate() -> None:
    camera = SimCamera("a", fps=10, join_s=1.0, leave_s=2.0, burst_frames=4, burst_every_s=0.5)
    result = simulate([camera], EXACT, settings("batch1", warmup_s=0.0, duration_s=3.0))
    assert result.total_offered == 10
    assert result.total_completed == 10


def test_same_seed_same_result() -> None:
    gpu = PROFILES["gpu_a100_trt_model"]
    cameras = make_cameras(Mix("m", (5.0, 30.0), 0.2), 40, frame_age_ms=200, seed=3, span_s=6)
    first, second = (simulate(cameras, gpu, settings("aimd", seed=3)) for _ in range(2))
    timings = {"policy_s": 0, "add_s": 0}
    assert {**first.row(), **timings} == {**second.row(), **timings}


# --- the sweep -----------------------------------------------------------------------------------


def test_a_small_sweep_writes_the_csv_plots_and_checks(tmp_path) -> None:
    points = [
        p
        for p in sweep_points(["cpu_ort_2core"], quick=True, max_seconds=4.0, seed=0)
        if p["cameras"] <= 3 and p["mix"].name == "5fps"
    ]
    rows = run_sweep(points, jobs=1)
    write_csv(rows, tmp_path / "sweep.csv")
    with (tmp_path / "sweep.csv").open() as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(points) == 2 * 7
    for column in (
        "profile",
        "mix",
        "cameras",
        "label",
        "offered_fps",
        "throughput_fps",
        "p50_ms",
        "p99_ms",
        "hp_p99_ms",
        "mean_batch",
        "drop_rate",
        "drop_stale",
        "drop_overflow",
        "max_waiting",
    ):
        assert column in written[0]
    assert {r["label"] for r in written} >= {"batch1", "static", "aimd", "adaptive"}
    checks = check_targets(rows)
    assert {c.target for c in checks} >= {"vs-timeout", "low-load"}
    assert all(c.format().startswith(("PASS", "FAIL")) for c in checks)
    assert "cpu_ort_2core" in format_table(rows)
    assert [p.name for p in plot_sweep(rows, tmp_path, "t")] == ["t_cpu_ort_2core_5fps.png"]


def test_cli_parses_simulate() -> None:
    args = build_parser().parse_args(["simulate", "--quick", "--profile", "cpu_ort_2core"])
    assert (
        args.quick and args.profile == "cpu_ort_2core" and args.handler.__name__ == "cmd_simulate"
    )
