"""Batch policies (``pipeline.batching``): the service model, when to dispatch, how big.

Pure logic with a simulated clock: every call gets ``now`` explicitly, nothing sleeps.  The
queues themselves (windows, fairness, bounds) are ``test_batching_queues.py``'s business.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.batching import (
    POLICIES,
    AdaptivePolicy,
    AimdPolicy,
    Batch1Policy,
    BatchPolicy,
    CameraRules,
    FrameQueues,
    Queued,
    ServiceModel,
    StaticPolicy,
    TimeoutPolicy,
    make_policy,
    policies,
)
from pipeline.batching.policies import aimd

ROOMY = 10_000  # max_waiting large enough that nothing overflows
DEFAULT_RULES = CameraRules()


def build(
    policy_class: type[BatchPolicy],
    max_batch_size: int = 4,
    *,
    preferred: tuple[int, ...] = (),
    default_rules: CameraRules = DEFAULT_RULES,
    rules: dict[str, CameraRules] | None = None,
    service: ServiceModel | None = None,
    queues: FrameQueues[str] | None = None,
    **kwargs: Any,
) -> Any:
    return policy_class(
        queues=queues or FrameQueues(max_waiting=ROOMY, default_rules=default_rules, rules=rules),
        max_batch_size=max_batch_size,
        preferred_batch_sizes=preferred,
        service=service,
        **kwargs,
    )


def fill(policy: BatchPolicy[str], arrivals: list[tuple[str, float]]) -> None:
    """Add frames named ``<camera><n>`` (n counting per camera from 0), captured = arrived."""
    counts: Counter[str] = Counter()
    for camera, now in arrivals:
        assert policy.add(camera, counts[camera], now, f"{camera}{counts[camera]}", now) == []
        counts[camera] += 1


def items(batch: list[Queued[str]]) -> list[str]:
    return [q.item for q in batch]


# --- the service model --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "c", "sizes", "decay"),
    [
        (0.02, 0.005, (1, 8), 0.98),
        (0.0, 0.01, (2, 4), 0.98),
        (0.1, 0.0, (1, 16), 0.98),  # no per-image cost: batching is free
        (0.015, 0.003, (1, 2, 4, 8), 0.9),
        (0.015, 0.003, (4, 4, 4, 8), 1.0),
    ],
)
def test_service_model_learns_both_terms_from_two_sizes(
    a: float, c: float, sizes: tuple[int, ...], decay: float
) -> None:
    model = ServiceModel(decay=decay)
    for _ in range(10):
        for size in sizes:
            model.observe(size, a + c * size)
    assert model.observed
    assert (model.a, model.c) == (pytest.approx(a, abs=1e-9), pytest.approx(c, abs=1e-9))
    assert model.estimate(32) == pytest.approx(a + 32 * c)


@pytest.mark.parametrize(
    ("observations", "c"),
    [
        ([(4, 0.04)], 0.01),
        ([(4, 0.04), (4, 0.08)], 0.015),  # the mean time of the one size
        ([(1, 0.03)] * 5, 0.03),
    ],
)
def test_service_model_with_one_size_is_proportional(
    observations: list[tuple[int, float]], c: float
) -> None:
    model = ServiceModel(a=0.5, c=0.5, decay=1.0)  # priors replaced by the first observation
    for size, seconds in observations:
        model.observe(size, seconds)
    assert (model.a, model.c) == (0.0, pytest.approx(c))
    assert model.estimate(8) == pytest.approx(8 * c)


def test_service_model_clamps_a_negative_slope() -> None:
    model = ServiceModel(decay=1.0)
    model.observe(1, 0.05)
    model.observe(8, 0.03)  # bigger batch faster: noise, not a negative cost per image
    assert (model.a, model.c) == (pytest.approx(0.04), 0.0)


@pytest.mark.parametrize(
    ("decay", "new_samples", "follows"),
    [(0.98, 300, True), (0.9, 60, True), (0.98, 5, False), (1.0, 300, False)],
)
def test_service_model_decay_follows_a_change(
    decay: float, new_samples: int, follows: bool
) -> None:
    model = ServiceModel(decay=decay)
    for size in [1, 8] * 50:  # the device as it was
        model.observe(size, 0.01 + 0.002 * size)
    for size in [1, 8] * (new_samples // 2):  # throttled: everything takes three times longer
        model.observe(size, 0.03 + 0.006 * size)
    close = model.estimate(1) == pytest.approx(0.036, rel=0.01) and model.estimate(
        8
    ) == pytest.approx(0.078, rel=0.01)
    assert close is follows
    assert 0.012 < model.estimate(1) <= 0.036 + 1e-9  # between the old and the new device


@pytest.mark.parametrize(
    ("model", "size", "seconds", "throughput"),
    [
        (ServiceModel(), 4, 0.0, float("inf")),  # nothing known: free
        (ServiceModel(a=0.02, c=0.005), 1, 0.025, 40.0),
        (ServiceModel(a=0.02, c=0.005), 8, 0.06, 8 / 0.06),
    ],
)
def test_service_model_priors_before_any_observation(
    model: ServiceModel, size: int, seconds: float, throughput: float
) -> None:
    assert not model.observed
    assert model.estimate(size) == pytest.approx(seconds)
    assert model.throughput(size) == pytest.approx(throughput)


# --- construction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy_class", "kwargs", "message"),
    [
        (TimeoutPolicy, {"max_batch_size": 0, "timeout_s": 0.05}, "max_batch_size"),
        (TimeoutPolicy, {"max_batch_size": 4, "timeout_s": -0.001}, "timeout"),
        (Batch1Policy, {"max_batch_size": -3}, "max_batch_size"),
        (AdaptivePolicy, {"max_batch_size": 4, "target_utilisation": 0.0}, "target_utilisation"),
        (AdaptivePolicy, {"max_batch_size": 4, "target_utilisation": 1.5}, "target_utilisation"),
    ],
)
def test_invalid_policy_arguments_raise(policy_class, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy_class(queues=FrameQueues(max_waiting=8), **kwargs)


def test_unknown_policy_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown batching policy 'timout'.*timeout"):
        make_policy("timout", max_batch_size=4, max_wait_ms=50)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_make_policy_builds_every_registered_policy(name: str) -> None:
    policy = make_policy(name, max_batch_size=4, max_wait_ms=50, preferred_batch_sizes=[2, 9])
    assert isinstance(policy, POLICIES[name])
    assert (policy.name, policy.max_batch_size, policy.waiting) == (name, 4, 0)
    assert policy.preferred == (2,)  # sizes above the max are ignored
    assert policy.queues.max_waiting == 16  # 4 x the max batch by default
    decision = policy.poll(1e9)
    assert (decision.batch, decision.dropped, decision.wake_at) == ([], [], None)
    assert policy.flush() == []


@pytest.mark.parametrize(
    ("name", "options", "attribute", "value"),
    [
        ("timeout", None, "timeout_s", 0.05),  # max_wait_ms is its timeout
        ("aimd", {"latency_target_ms": 300}, "timeout_s", 0.05),
        ("aimd", {"latency_target_ms": 300}, "latency_target_s", 0.3),
        ("aimd", None, "latency_target_s", 0.2),  # the default
        ("adaptive", {"target_utilisation": 0.7}, "target_utilisation", 0.7),
        ("adaptive", {}, "target_utilisation", 0.85),  # the default
        ("aimd", aimd.Options(latency_target_ms=300), "latency_target_s", 0.3),  # validated
    ],
)
def test_make_policy_passes_its_settings(
    name: str, options: Any, attribute: str, value: float
) -> None:
    policy = make_policy(name, max_batch_size=4, max_wait_ms=50, options=options)
    assert getattr(policy, attribute) == pytest.approx(value)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "adaptive",
            {"latency_target_ms": 300},
            "the adaptive batching policy has no setting 'latency_target_ms' "
            "(its settings: target_utilisation)",
        ),
        (
            "timeout",
            {"target_utilisation": 0.7, "latency_target_ms": 300},
            "the timeout batching policy has no setting 'latency_target_ms', "
            "'target_utilisation' (it has none)",
        ),
        (
            "aimd",
            {"latency_target_ms": 300, "target_utilisation": 0.7},
            "the aimd batching policy has no setting 'target_utilisation' "
            "(its settings: latency_target_ms)",
        ),
        ("batch1", {"name": "aimd"}, "the batch1 batching policy has no setting 'name'"),
        (
            "adaptive",
            {"target_utilisation": 1.5},
            "the adaptive batching policy: target_utilisation: Input should be less than or equal",
        ),
        ("adaptive", aimd.Options(), "options for the aimd policy given to the adaptive policy"),
    ],
)
def test_make_policy_refuses_a_setting_the_policy_does_not_have(
    name: str, options: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make_policy(name, max_batch_size=4, max_wait_ms=50, options=options)


NEW_POLICY = '''"""A policy dropped beside the project's own: every frame alone, after a pause."""

from typing import Any, Literal

from pydantic import Field

from pipeline.batching.policies.base import BatchPolicy, PolicyOptions, SharedSettings


class Options(PolicyOptions):
    name: Literal["pause"] = Field("pause", description="The policy")
    pause_ms: float = Field(5.0, gt=0, description="How long every frame waits")


class PausePolicy(BatchPolicy[Any]):
    name = "pause"

    def __init__(self, *, pause_s: float, **kwargs):
        super().__init__(**kwargs)
        self.pause_s = pause_s

    def size_now(self, now: float) -> int:
        return 1


def build_policy(options: Options, shared: SharedSettings) -> PausePolicy:
    return PausePolicy(pause_s=options.pause_ms / 1000, **shared.base_arguments())
'''


@pytest.fixture
def policy_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder searched for policy modules after the project's own."""
    folder = tmp_path / "policies"
    folder.mkdir()
    monkeypatch.setattr(policies, "__path__", [*policies.__path__, str(folder)])
    policies.policy_modules.cache_clear()
    yield folder
    policies.policy_modules.cache_clear()
    for module in folder.glob("*.py"):  # imported from this folder only
        sys.modules.pop(f"{policies.__name__}.{module.stem}", None)


def test_each_policy_module_is_registered_under_its_own_name() -> None:
    assert policies.policy_names() == ("adaptive", "aimd", "batch1", "static", "timeout")
    assert sorted(POLICIES) == list(policies.policy_names())
    for name, module in policies.policy_modules().items():
        assert module.__name__ == f"pipeline.batching.policies.{name}" and module.__doc__
        assert POLICIES[name].name == name and callable(module.build_policy)
        options = module.Options()  # every setting has a default
        assert options.name == name and options.model_config["extra"] == "forbid"
        assert [f for f, info in module.Options.model_fields.items() if not info.description] == []
    assert policies.policy_settings("adaptive") == ("target_utilisation",)
    assert policies.policy_settings("aimd") == ("latency_target_ms",)


def test_one_new_module_is_a_new_policy(policy_folder: Path) -> None:
    (policy_folder / "pause.py").write_text(NEW_POLICY)
    assert "pause" in policies.policy_names()
    policy = make_policy("pause", max_batch_size=4, max_wait_ms=50, options={"pause_ms": 20})
    assert (policy.name, policy.pause_s, policy.max_batch_size) == ("pause", 0.02, 4)
    with pytest.raises(ValueError, match="the pause batching policy has no setting 'pause_s'"):
        make_policy("pause", max_batch_size=4, max_wait_ms=50, options={"pause_s": 20})


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("Options = None\n", "halfdone must define Options (name: Literal['halfdone'])"),
        (NEW_POLICY, "halfdone must define Options (name: Literal['halfdone'])"),
        (
            NEW_POLICY.replace('"pause"', '"halfdone"').replace("name = ", "label = "),
            "halfdone must define one BatchPolicy named 'halfdone'",
        ),
    ],
)
def test_a_module_that_is_not_a_policy_is_named(
    policy_folder: Path, module: str, message: str
) -> None:
    (policy_folder / "halfdone.py").write_text(module)
    with pytest.raises(TypeError, match=re.escape(message)):
        policies.policy_names()


# --- batch1, static, timeout --------------------------------------------------------------


@pytest.mark.parametrize(("waiting", "preferred"), [(1, ()), (3, ()), (5, (2, 4))])
def test_batch1_sends_every_frame_alone_at_once(waiting: int, preferred: tuple[int, ...]) -> None:
    policy = build(Batch1Policy, 4, preferred=preferred)
    fill(policy, [("ab"[i % 2], 0.0) for i in range(waiting)])
    sizes = [len(policy.poll(0.0).batch) for _ in range(waiting + 1)]
    assert sizes == [1] * waiting + [0]


@pytest.mark.parametrize(
    ("max_batch_size", "waiting", "now", "dispatched"),
    [(4, 3, 0.0, 0), (4, 3, 1e6, 0), (4, 4, 0.0, 4), (4, 9, 0.0, 4), (1, 1, 0.0, 1)],
)
def test_static_waits_for_a_full_batch(
    max_batch_size: int, waiting: int, now: float, dispatched: int
) -> None:
    policy = build(StaticPolicy, max_batch_size)
    fill(policy, [("a", 0.0)] * waiting)
    decision = policy.poll(now)
    assert len(decision.batch) == dispatched
    assert decision.wake_at is None  # nothing but an arrival can make it ready


@pytest.mark.parametrize(
    ("max_batch_size", "timeout_s", "arrivals", "now", "dispatched", "wake_at"),
    [
        (4, 10.0, [("a", 0.0)] * 4, 0.0, 4, None),  # full: at once
        (4, 10.0, [("a", 0.0), ("b", 0.0), ("c", 0.0), ("d", 0.0)], 0.0, 4, None),
        (4, 10.0, [("a", 0.0)] * 9, 0.0, 4, None),
        (4, 10.0, [("a", 0.0)] * 3, 0.0, 0, 10.0),
        (8, 0.05, [("a", 1.0)], 1.049, 0, 1.05),  # just before the oldest's timeout
        (8, 0.05, [("a", 1.0)], 1.05, 1, None),  # exactly at it
        (8, 0.05, [("a", 1.0)], 7.0, 1, None),
        # the deadline follows the oldest frame, whichever camera holds it
        (8, 0.5, [("b", 3.0), ("a", 2.0), ("c", 2.5)], 2.49, 0, 2.5),
        (8, 0.5, [("b", 3.0), ("a", 2.0), ("c", 2.5)], 2.5, 3, None),
        (8, 0.0, [("a", 4.0)], 4.0, 1, None),  # timeout 0: whatever waits goes at once
    ],
)
def test_timeout_dispatches_when_full_or_at_the_oldest_plus_timeout(
    max_batch_size: int,
    timeout_s: float,
    arrivals: list[tuple[str, float]],
    now: float,
    dispatched: int,
    wake_at: float | None,
) -> None:
    policy = build(TimeoutPolicy, max_batch_size, timeout_s=timeout_s)
    fill(policy, arrivals)
    decision = policy.poll(now)
    assert len(decision.batch) == dispatched
    assert decision.dropped == []
    assert decision.wake_at == (None if wake_at is None else pytest.approx(wake_at))


@pytest.mark.parametrize(
    ("policy_class", "preferred", "max_batch_size", "available", "size"),
    [
        (TimeoutPolicy, (), 8, 6, 6),
        (TimeoutPolicy, (4, 8), 8, 6, 4),  # the largest preferred size that fits
        (TimeoutPolicy, (4, 8), 8, 3, 3),  # none fits: all of them
        (TimeoutPolicy, (4, 8), 8, 20, 8),
        (TimeoutPolicy, (2, 4, 8, 16), 8, 7, 4),  # 16 is above the max and ignored
        (TimeoutPolicy, (16,), 8, 10, 8),
        (TimeoutPolicy, (1,), 8, 3, 1),
        (TimeoutPolicy, (8, 4, 4), 8, 5, 4),  # order and repeats do not matter
        (AdaptivePolicy, (4, 8), 8, 6, 4),
        (Batch1Policy, (4, 8), 8, 6, 1),  # batch1 sends one frame whatever is preferred
        (Batch1Policy, (), 8, 0, 0),
    ],
)
def test_fit_picks_the_largest_preferred_size_that_fits(
    policy_class: type[BatchPolicy],
    preferred: tuple[int, ...],
    max_batch_size: int,
    available: int,
    size: int,
) -> None:
    kwargs = {"timeout_s": 0.05} if policy_class is TimeoutPolicy else {}
    policy = build(policy_class, max_batch_size, preferred=preferred, **kwargs)
    assert policy.fit(available) == size


@pytest.mark.parametrize(
    ("preferred", "waiting", "sizes"),
    [((), 6, [6]), ((4, 8), 6, [4, 2]), ((4, 8), 3, [3]), ((2, 4, 8, 16), 7, [4, 2, 1])],
)
def test_timeout_at_its_deadline_snaps_to_preferred_sizes(
    preferred: tuple[int, ...], waiting: int, sizes: list[int]
) -> None:
    policy = build(TimeoutPolicy, 8, preferred=preferred, timeout_s=0.05)
    fill(policy, [("a", 0.0)] * waiting)
    assert [len(policy.poll(0.05).batch) for _ in sizes] == sizes
    assert policy.waiting == 0


# --- aimd ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("observations", "cap"),
    [
        ([], 1.0),
        ([(1, 0.01)], 2.0),  # met the target: one more
        ([(1, 0.01)] * 3, 4.0),
        ([(1, 0.01)] * 10, 4.0),  # never above the max batch size
        ([(1, 0.01), (1, 0.01), (2, 0.5)], 3 * 0.7),  # a miss shrinks by the factor
        ([(1, 0.01)] * 3 + [(4, 0.5)] * 2, 4 * 0.7 * 0.7),
        ([(1, 0.5)], 1.0),  # never below 1
        ([(1, 0.1)], 2.0),  # exactly on target is on target
    ],
)
def test_aimd_cap_grows_by_one_and_shrinks_by_the_factor(
    observations: list[tuple[int, float]], cap: float
) -> None:
    policy = build(AimdPolicy, 4, timeout_s=0.05, latency_target_s=0.1)
    for size, seconds in observations:
        policy.observe(size, seconds)
    assert policy.cap == pytest.approx(cap)


@pytest.mark.parametrize(
    ("on_target", "waiting", "now", "dispatched"),
    [
        (0, 1, 0.0, 1),  # cap 1: every frame at once
        (2, 2, 0.0, 0),  # cap 3: waits for three ...
        (2, 3, 0.0, 3),
        (2, 7, 0.0, 3),  # ... and sends no more than three
        (2, 2, 0.05, 2),  # or until the timeout
        (1, 2, 0.0, 2),  # cap 2
    ],
)
def test_aimd_dispatches_up_to_its_cap(
    on_target: int, waiting: int, now: float, dispatched: int
) -> None:
    policy = build(AimdPolicy, 8, timeout_s=0.05, latency_target_s=0.1)
    for _ in range(on_target):
        policy.observe(1, 0.01)
    fill(policy, [("a", 0.0)] * waiting)
    assert len(policy.poll(now).batch) == dispatched


@pytest.mark.parametrize(("seconds", "cap"), [(0.06, 3.0), (0.1, 3.0), (0.11, 2 * 0.7)])
def test_aimd_judges_a_batch_by_its_service_time_not_its_queueing(
    seconds: float, cap: float
) -> None:
    policy = build(AimdPolicy, 8, timeout_s=0.05, latency_target_s=0.1)
    policy.observe(1, 0.01)  # cap 2
    fill(policy, [("a", 0.0)])
    assert policy.poll(0.0).batch == []
    assert len(policy.poll(0.05).batch) == 1  # waited 50 ms for the timeout
    policy.observe(1, seconds)  # only the inference counts against the 100 ms target
    assert policy.cap == pytest.approx(cap)


# --- adaptive -----------------------------------------------------------------------------
# With t(b) = 0.02 + 0.005 b and a target utilisation of 0.85, batches of b keep up with
# rates up to 0.85 b / t(b): 34/s for b = 1, 56.7 for 2, 72.9 for 3, 85 for 4, 94.4 for 5,
# 102 for 6, 113 for 8.  When nothing keeps up, the target is the smallest batch with 95 % of
# the best throughput b / t(b): 7 of at most 8 (127 vs 133 frames/s), 4 of at most 4.


def loaded_model() -> ServiceModel:
    return ServiceModel(a=0.02, c=0.005)


def adaptive_fleet(
    cameras: int,
    fps: float,
    *,
    max_batch_size: int = 8,
    preferred: tuple[int, ...] = (),
    max_wait_ms: float = 100.0,
) -> AdaptivePolicy[str]:
    """An adaptive policy that has heard ``cameras`` cameras at ``fps`` (one frame each, taken).

    Frames added later with ``captured=0.0`` keep the measured rate at exactly ``fps``."""
    rules = CameraRules(max_wait_frames=2, max_wait_ms=max_wait_ms, fps=fps)
    policy = build(
        AdaptivePolicy,
        max_batch_size,
        preferred=preferred,
        default_rules=rules,
        service=loaded_model(),
        hold=3,
    )
    for i in range(cameras):
        policy.add(f"c{i}", 0, -1 / fps, "warm-up", -1 / fps)
    policy.flush()
    return policy


def add_now(policy: BatchPolicy[str], arrivals: list[tuple[str, float]]) -> None:
    """Frames captured at 0.0 (so the measured rates stay put) arriving at the given times."""
    for n, (camera, now) in enumerate(arrivals, start=1):
        policy.add(camera, n, 0.0, f"{camera}@{now}", now)


@pytest.mark.parametrize(
    ("cameras", "fps", "max_batch_size", "preferred", "target"),
    [
        (1, 10.0, 8, (), 1),  # low load: rate * t(1) = 0.25, well under 0.85
        (2, 15.0, 8, (), 1),  # 30/s
        (2, 25.0, 8, (), 2),  # 50/s
        (4, 20.0, 8, (), 4),  # 80/s
        (4, 25.0, 8, (), 6),  # 100/s
        (8, 20.0, 8, (), 8),  # 160/s: nothing keeps up, within 1 % of the best throughput
        (8, 20.0, 4, (), 4),
        (1, 10.0, 8, (4, 8), 1),  # low load stays at 1, preferred sizes or not
        (2, 25.0, 8, (4, 8), 4),  # snapped up to a preferred size
        (4, 25.0, 8, (4, 8), 8),
    ],
)
def test_adaptive_target_is_the_smallest_batch_that_keeps_up(
    cameras: int, fps: float, max_batch_size: int, preferred: tuple[int, ...], target: int
) -> None:
    policy = adaptive_fleet(cameras, fps, max_batch_size=max_batch_size, preferred=preferred)
    add_now(policy, [("c0", 0.0)])
    decision = policy.poll(0.0)
    assert policy.target == target
    assert len(decision.batch) == (1 if target == 1 else 0)  # low load: at once, alone


@pytest.mark.parametrize(
    ("arrivals", "now", "dispatched", "wake_at"),
    [
        # 4 cameras at 20 fps (80/s): the target is 4, each frame's window 2 / 20 fps = 100 ms
        ([("c0", 0.0)], 0.0, 0, 3 / 80),  # the next three frames are due in 37.5 ms
        ([("c0", 0.0)], 0.08, 0, 0.1),  # ... unless c0's window closes first
        ([("c0", 0.0), ("c1", 0.01), ("c2", 0.02)], 0.02, 0, 0.02 + 1 / 80),
        ([("c0", 0.0), ("c1", 0.01), ("c2", 0.02), ("c3", 0.03)], 0.03, 4, None),
        (
            [("c0", 0.0), ("c1", 0.0), ("c2", 0.0), ("c0", 0.0), ("c1", 0.0), ("c2", 0.0)],
            0,
            6,
            None,
        ),
        ([(f"c{i % 4}", 0.0) for i in range(11)], 0.0, 8, None),  # never above the max
        # never past a frame's window: a due frame forces the batch out
        ([("c0", 0.0)], 0.0999, 0, 0.1),
        ([("c0", 0.0)], 0.1, 1, None),
        ([("c0", 0.0), ("c1", 0.05)], 0.09, 0, 0.1),
        ([("c0", 0.0), ("c1", 0.05)], 0.1, 2, None),
    ],
)
def test_adaptive_at_high_load_waits_for_the_target_but_not_past_a_window(
    arrivals: list[tuple[str, float]], now: float, dispatched: int, wake_at: float | None
) -> None:
    policy = adaptive_fleet(4, 20.0)
    add_now(policy, arrivals)
    decision = policy.poll(now)
    assert policy.target == 4
    assert len(decision.batch) == dispatched
    assert decision.wake_at == (None if wake_at is None else pytest.approx(wake_at))


class FakeRateQueues(FrameQueues[str]):
    """Queues whose arrival rate is whatever the test sets."""

    rate = 0.0

    def arrival_rate(self, now: float) -> float:
        return self.rate


@pytest.mark.parametrize(
    ("hold", "preferred", "rates", "targets"),
    [
        # rises at once, falls only after `hold` consecutive lower decisions
        (3, (), [30, 80, 30, 30, 30, 30], [1, 4, 4, 4, 1, 1]),
        (3, (), [100, 50, 30, 30], [6, 6, 6, 1]),  # to the latest lower target
        (3, (), [80, 30, 30, 50], [4, 4, 4, 2]),
        # a rate wobbling around a boundary (85/s between 4 and 5) does not oscillate
        (3, (), [84, 86, 84, 86, 84, 86, 84, 86], [4, 5, 5, 5, 5, 5, 5, 5]),
        (3, (), [80, 30, 30, 80, 30, 30, 30], [4, 4, 4, 4, 4, 4, 1]),  # the streak restarts
        (1, (), [80, 30, 80, 30], [4, 1, 4, 1]),
        (3, (4, 8), [50, 100, 50, 50, 50], [4, 8, 8, 8, 4]),
    ],
)
def test_adaptive_stability_guard(
    hold: int, preferred: tuple[int, ...], rates: list[float], targets: list[int]
) -> None:
    queues = FakeRateQueues(max_waiting=ROOMY)
    policy = build(
        AdaptivePolicy, 8, preferred=preferred, service=loaded_model(), queues=queues, hold=hold
    )
    got = []
    for n, rate in enumerate(rates):
        queues.rate = rate
        queues.add("a", n, 0.0, f"a{n}", 0.0)  # a decision needs a frame waiting
        policy.poll(0.0)
        got.append(policy.target)
    assert got == targets


def test_adaptive_at_low_load_dispatches_at_once_even_with_preferred_sizes() -> None:
    policy = adaptive_fleet(1, 10.0, preferred=(4, 8))  # 10/s: rate * t(1) = 0.25
    add_now(policy, [("c0", 0.0)])
    assert len(policy.poll(0.0).batch) == 1


def test_adaptive_dispatches_the_batch_it_waited_for() -> None:
    policy = adaptive_fleet(8, 20.0, preferred=(4,))  # 160/s: target 8, above preferred 4
    for n in range(8):
        add_now(policy, [(f"c{n}", 0.0)])
        batch = policy.poll(0.0).batch
        if batch:
            break
    # the first batch takes everything it waited for, not just the preferred 4
    assert (len(batch), policy.waiting, policy.target) == (8, 0, 8)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_poll_while_the_detector_is_busy_never_dispatches(name: str) -> None:
    policy = make_policy(name, max_batch_size=4, max_wait_ms=10, service=loaded_model())
    fill(policy, [("abcd"[i % 4], i * 0.01) for i in range(8)])  # full batches, windows closed
    for now in (0.0, 0.5, 100.0):
        assert policy.poll(now, idle=False).batch == []
    assert policy.waiting == 8
    assert len(policy.poll(100.0).batch) >= 1


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(("max_batch_size", "frames"), [(4, 0), (4, 1), (4, 10), (1, 3), (8, 13)])
def test_flush_returns_everything_in_bounded_batches(
    name: str, max_batch_size: int, frames: int
) -> None:
    policy = make_policy(name, max_batch_size=max_batch_size, max_wait_ms=60_000)
    policy.queues.max_waiting = ROOMY
    fill(policy, [("abc"[i % 3], i * 0.001) for i in range(frames)])
    batches = policy.flush()
    assert all(1 <= len(batch) <= max_batch_size for batch in batches)
    assert sum(len(batch) for batch in batches) == frames
    assert len({q.item for batch in batches for q in batch}) == frames
    assert policy.waiting == 0


@pytest.mark.parametrize(
    ("policy_class", "preferred", "a", "c", "now", "stale", "sent"),
    [
        (TimeoutPolicy, (), 0.05, 0.0, 0.04, 0, 3),  # finishes at 0.09: in time
        (TimeoutPolicy, (), 0.05, 0.0, 0.05, 0, 3),  # finishes exactly at the deadline
        # no batch finishes before 0.11: dropped before inference, the others go
        (TimeoutPolicy, (), 0.05, 0.0, 0.06, 1, 2),
        (TimeoutPolicy, (), 0.0, 0.0, 0.1, 0, 3),
        # all 3 would finish at 0.11; a batch of 2 finishes at 0.09, and live0 goes in it
        (TimeoutPolicy, (), 0.0, 0.02, 0.05, 0, 2),
        (TimeoutPolicy, (), 0.0, 0.02, 0.035, 0, 3),
        (TimeoutPolicy, (2,), 0.0, 0.02, 0.05, 0, 2),  # a preferred batch of 2: t(2) = 0.04
        # a batch of 2 ends at 0.11: the two files go, not live0 alone (the largest batch in time)
        (TimeoutPolicy, (2,), 0.0, 0.02, 0.07, 1, 2),
        (Batch1Policy, (), 0.0, 0.02, 0.05, 0, 1),  # alone: t(1) = 0.02
        (Batch1Policy, (), 0.0, 0.02, 0.09, 1, 1),
    ],
)
def test_poll_drops_frames_that_would_finish_stale(
    policy_class: type[BatchPolicy],
    preferred: tuple[int, ...],
    a: float,
    c: float,
    now: float,
    stale: int,
    sent: int,
) -> None:
    policy = build(
        policy_class,
        4,
        preferred=preferred,
        rules={"live": CameraRules(max_frame_age_ms=100)},
        service=ServiceModel(a=a, c=c),
        **({"timeout_s": 0.0} if policy_class is TimeoutPolicy else {}),
    )
    policy.add("live", 0, 0.0, "live0", 0.0)  # expires at 0.1
    fill(policy, [("file", 0.0), ("file", 0.0)])  # no freshness deadline
    decision = policy.poll(now)
    assert [(d.frame.item, d.cause) for d in decision.dropped] == [("live0", "stale")] * stale
    assert len(decision.batch) == sent
    assert policy.waiting + len(decision.batch) == 3 - stale
    finish = now + policy.service.estimate(sent)
    assert all(q.expires is None or q.expires >= finish for q in decision.batch)


@pytest.mark.parametrize("policy_class", [TimeoutPolicy, AdaptivePolicy])
@pytest.mark.parametrize("start_delay_s", [0.0, 0.18, 0.38])
def test_a_deadline_shorter_than_a_full_batch_sizes_the_batch_instead_of_starving(
    policy_class: type[BatchPolicy], start_delay_s: float
) -> None:
    """Overload with a short deadline: a full batch (t(8) = 0.45 s) behind the running one
    always ends late, so dropping every frame late *in that batch* processed nothing (measured:
    8 frames in 36 s). The batch is sized to what still makes it."""
    live = CameraRules(max_frame_age_ms=500, max_wait_ms=0)
    policy = build(
        policy_class,
        8,
        default_rules=live,
        service=ServiceModel(a=0.05, c=0.05),
        **({"timeout_s": 0.0} if policy_class is TimeoutPolicy else {}),
    )
    add_now(policy, [(f"c{i % 4}", 0.0) for i in range(16)])  # captured now: 0.5 s of slack
    decision = policy.poll(0.0, start_delay_s=start_delay_s)
    largest = max(b for b in range(1, 9) if start_delay_s + 0.05 + 0.05 * b <= 0.5)
    assert (len(decision.batch), decision.dropped) == (largest, [])
    # not idle (the detector busy): only frames late even alone after the running batch go
    assert policy.poll(0.0, idle=False, start_delay_s=start_delay_s).dropped == []
    assert len(policy.poll(0.0, idle=False, start_delay_s=0.41).dropped) == 16 - largest


def test_aimd_freshness_horizon_is_the_batch_it_would_send() -> None:
    policy = build(
        AimdPolicy,
        8,
        rules={"live": CameraRules(max_frame_age_ms=30)},
        service=loaded_model(),
        timeout_s=0.05,
        latency_target_s=0.2,
    )
    policy.add("live", 0, 0.0, "live0", 0.0)  # expires at 0.03; first in the round-robin
    fill(policy, [("file", 0.0)] * 7)
    decision = policy.poll(0.0)  # cap 1: one frame now, done at t(1) = 0.025
    assert (items(decision.batch), decision.dropped) == (["live0"], [])


def test_adaptive_sizes_its_batch_to_the_earliest_deadline() -> None:
    fleet = CameraRules(max_wait_frames=2, max_wait_ms=100, fps=20)
    live = CameraRules(max_wait_frames=2, max_wait_ms=100, fps=20, max_frame_age_ms=50)
    policy = build(
        AdaptivePolicy,
        8,
        preferred=(4,),
        default_rules=fleet,
        rules={"c0": live},
        service=loaded_model(),
    )
    for i in range(8):  # 8 cameras at 20 fps: 160/s, target 8
        policy.add(f"c{i}", 0, -0.05, "warm-up", -0.05)
    policy.flush()
    add_now(policy, [(f"c{i}", 0.0) for i in range(8)])  # c0's frame expires at 0.05
    # the batch of 8 it waited for would finish at t(8) = 0.06, after c0's deadline; 7 would
    # too (0.055), so the preferred 4 goes (0.04), c0 in it
    decision = policy.poll(0.0)
    assert (items(decision.batch), decision.dropped) == (
        ["c0@0.0", "c1@0.0", "c2@0.0", "c3@0.0"],
        [],
    )


# --- properties ---------------------------------------------------------------------------

CAMERAS = ("a", "b", "c", "d")

camera_rules = st.builds(
    CameraRules,
    priority=st.integers(0, 2),
    max_wait_frames=st.none() | st.floats(0.5, 4),
    max_wait_ms=st.floats(0, 200),
    max_frame_age_ms=st.none() | st.floats(1, 300),
    keep_latest=st.booleans(),
    fps=st.none() | st.floats(1, 60),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(CAMERAS), st.floats(0, 0.05)),
        st.tuples(st.just("poll"), st.booleans(), st.floats(0, 0.05)),  # idle or not
        st.tuples(st.just("observe"), st.integers(1, 8), st.floats(0.001, 0.1)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(POLICIES)),
    max_batch_size=st.integers(1, 8),
    preferred=st.lists(st.integers(1, 8), max_size=3),
    max_queue_frames=st.integers(1, 30),
    rules=st.dictionaries(st.sampled_from(CAMERAS), camera_rules),
    lags=st.fixed_dictionaries({camera: st.floats(0, 0.2) for camera in CAMERAS}),
    ops=operations,
)
def test_every_frame_is_dispatched_dropped_or_flushed_exactly_once(
    name: str,
    max_batch_size: int,
    preferred: list[int],
    max_queue_frames: int,
    rules: dict[str, CameraRules],
    lags: dict[str, float],
    ops: list[tuple[str, Any, float]],
) -> None:
    policy = make_policy(
        name,
        max_batch_size=max_batch_size,
        max_wait_ms=30,
        preferred_batch_sizes=preferred,
        max_queue_frames=max_queue_frames,
        camera_rules=rules,
        service=loaded_model(),
    )
    now = 0.0
    added: dict[str, int] = Counter()
    outcomes: list[tuple[str, int]] = []  # every frame that left: dispatched, dropped, flushed
    sent: dict[str, list[int]] = {camera: [] for camera in CAMERAS}

    def check_batch(batch: list[Queued[Any]]) -> None:
        assert 1 <= len(batch) <= max_batch_size
        for q in batch:
            assert q.item == (q.camera, q.seq)
            sent[q.camera].append(q.seq)
            outcomes.append(q.item)

    for kind, arg, value in ops:
        if kind == "observe":
            policy.observe(arg, value)
            continue
        now += value
        if kind == "add":
            seq = added[arg]
            added[arg] += 1
            dropped = policy.add(arg, seq, now - lags[arg], (arg, seq), now)
            for d in dropped:
                assert d.cause in ("superseded", "overflow")
                if d.cause == "superseded":
                    assert d.frame.camera == arg and rules[arg].keep_latest
        else:
            decision = policy.poll(now, idle=arg)
            dropped = decision.dropped
            for d in dropped:
                assert d.cause == "stale" and rules[d.frame.camera].max_frame_age_ms is not None
            if not arg:
                assert decision.batch == []
            if decision.batch:
                check_batch(decision.batch)
                assert decision.wake_at is None
            elif arg and policy.waiting and name == "adaptive":
                assert policy.queues.due(now) == 0  # never past a frame's window
        outcomes.extend(d.frame.item for d in dropped)
        assert policy.waiting == sum(added.values()) - len(outcomes) <= max_queue_frames

    for batch in policy.flush():
        check_batch(batch)
    assert policy.waiting == 0
    # nothing lost, nothing duplicated
    assert sorted(outcomes) == sorted((c, seq) for c, n in added.items() for seq in range(n))
    for camera in CAMERAS:  # each camera's frames leave in order
        assert sent[camera] == sorted(sent[camera])


WINDOW_BOUND = {  # by when each policy sends a frame that arrived at `arrived`
    "batch1": lambda q, timeout_s: q.arrived,
    "timeout": lambda q, timeout_s: q.arrived + timeout_s,
    "aimd": lambda q, timeout_s: q.arrived + timeout_s,
    "adaptive": lambda q, timeout_s: q.dispatch_by,
}


@pytest.mark.parametrize("name", sorted(WINDOW_BOUND))
@settings(max_examples=100, deadline=None)
@given(
    max_batch_size=st.integers(1, 6),
    preferred=st.lists(st.integers(1, 6), max_size=2),
    max_wait_ms=st.floats(0, 200),
    fps=st.none() | st.floats(1, 60),
    observations=st.lists(st.tuples(st.integers(1, 6), st.floats(0.001, 0.05)), max_size=5),
    arrivals=st.lists(
        st.tuples(st.sampled_from(CAMERAS), st.just(0.0) | st.floats(0.001, 0.05)), min_size=1
    ),
)
def test_polled_at_wake_at_no_frame_waits_past_its_bound(
    name: str,
    max_batch_size: int,
    preferred: list[int],
    max_wait_ms: float,
    fps: float | None,
    observations: list[tuple[int, float]],
    arrivals: list[tuple[str, float]],
) -> None:
    policy = make_policy(
        name,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        preferred_batch_sizes=preferred,
        max_queue_frames=ROOMY,
        default_rules=CameraRules(max_wait_ms=max_wait_ms, fps=fps),
        service=loaded_model(),
    )
    for size, seconds in observations:
        policy.observe(size, seconds)
    times, now = [], 0.0
    for _, step in arrivals:
        now += step
        times.append(now)
    now, i, wake, sent = 0.0, 0, None, 0
    for _ in range(100_000):  # each step adds, sends, or moves the clock forward
        if i == len(arrivals) and not policy.waiting:
            break
        if wake is not None and (i == len(arrivals) or wake <= times[i]):
            now = max(now, wake)
        else:
            assert i < len(arrivals), "frames wait and nothing will wake the policy"
            now = times[i]
            policy.add(arrivals[i][0], i, now, str(i), now)
            i += 1
        decision = policy.poll(now)
        for q in decision.batch:
            assert now <= WINDOW_BOUND[name](q, max_wait_ms / 1000) + 1e-9
        sent += len(decision.batch)
        if not decision.batch and policy.waiting and decision.wake_at is not None:
            assert decision.wake_at > now  # a wake-up that changes nothing would spin
        wake = now if decision.batch else decision.wake_at
    assert (i, sent, policy.waiting) == (len(arrivals), len(arrivals), 0)


# --- adaptive: no batch past the efficient size once t(b) is fitted -------------------------


def fitted(a: float, c: float, sizes: tuple[int, ...] = (1, 8)) -> ServiceModel:
    model = ServiceModel()
    for size in sizes * 10:
        model.observe(size, a + c * size)
    return model


@pytest.mark.parametrize(
    ("a", "c", "max_batch_size", "backlog", "expected"),
    [
        (0.0, 0.066, 8, 8, 1),  # a CPU: t(b) proportional, batching gains nothing
        (0.00089, 0.0001, 32, 32, 31),  # the GPU model: within 1 % of the best only at 31
        (0.02, 0.005, 8, 8, 8),  # a large fixed cost: the full batch is the efficient one
    ],
)
def test_adaptive_backlog_goes_in_batches_of_the_efficient_size(
    a: float, c: float, max_batch_size: int, backlog: int, expected: int
) -> None:
    policy = build(AdaptivePolicy, max_batch_size, service=fitted(a, c))
    fill(policy, [(f"c{i}", 0.0) for i in range(backlog)])
    assert policy.service.fitted
    assert len(policy.poll(0.0).batch) == expected


@pytest.mark.parametrize(
    ("measured", "expected"),
    [
        # a CPU: the cost per image grows with the batch (caches), as measured here
        ({1: 0.0425, 8: 0.432}, 1),
        ({1: 0.0425, 2: 0.086, 4: 0.16, 8: 0.432}, 4),
        # a GPU: a large fixed cost, the full batch
        ({1: 0.004, 8: 0.011}, 8),
    ],
)
def test_adaptive_backlog_takes_the_size_with_the_best_measured_throughput(
    measured: dict[int, float], expected: int
) -> None:
    """The line through t(1) and t(8) says nothing of a cost per image that grows with the
    batch; each size's own time does."""
    model = ServiceModel()
    for _ in range(10):
        for size, seconds in measured.items():
            model.observe(size, seconds)
    policy = build(AdaptivePolicy, 8, service=model)
    fill(policy, [(f"c{i}", 0.0) for i in range(16)])
    assert len(policy.poll(0.0).batch) == expected


def test_service_model_follows_a_size_that_got_slower() -> None:
    model = ServiceModel()
    for size, seconds in [(1, 0.04), (8, 0.40)] * 5:
        model.observe(size, seconds)
    assert model.throughput(1) > model.throughput(8)
    for _ in range(12):  # batches of one, now slowed down (another process took the cache)
        model.observe(1, 0.06)
    assert model.throughput(1) == pytest.approx(1 / 0.06, rel=0.05)
    assert model.throughput(1) < model.throughput(8)


def test_adaptive_sends_full_batches_until_the_service_time_is_fitted() -> None:
    policy = build(AdaptivePolicy, 8, service=fitted(0.0, 0.066, sizes=(1,)))  # one size seen
    fill(policy, [(f"c{i}", 0.0) for i in range(8)])
    assert not policy.service.fitted
    assert len(policy.poll(0.0).batch) == 8  # a larger size is how t(b) gets learned


@pytest.mark.parametrize(("start_delay_s", "dropped"), [(0.0, []), (0.02, ["live0"])])
def test_freshness_counts_the_wait_for_the_batch_ahead(start_delay_s: float, dropped: list) -> None:
    live = CameraRules(max_frame_age_ms=30)
    policy = build(Batch1Policy, 4, rules={"live": live}, service=ServiceModel(a=0.02, c=0.005))
    policy.add("live", 0, 0.0, "live0", 0.0)  # due by 0.03; a batch of 1 takes 0.025
    decision = policy.poll(0.0, start_delay_s=start_delay_s)
    assert [d.frame.item for d in decision.dropped] == dropped
    assert items(decision.batch) == ([] if dropped else ["live0"])


# --- file jobs paced by backpressure ------------------------------------------------------


@pytest.mark.parametrize(
    ("backlogged", "waiting", "dispatched", "wake_at"),
    [
        # a file job's measured rate follows the detector: it says nothing of its demand, so
        # the policy waits for the efficient batch (7 here) inside the window, and sleeps
        # until a frame comes or the window closes instead of polling
        (True, 1, 0, 1.0),
        (True, 6, 0, 1.0),
        (True, 7, 7, None),
        # a live camera at the same measured rate: one frame alone keeps up, at once
        (False, 1, 1, None),
    ],
)
def test_a_backlogged_file_job_waits_for_the_efficient_batch(
    backlogged: bool, waiting: int, dispatched: int, wake_at: float | None
) -> None:
    rules = CameraRules(max_wait_frames=None, max_wait_ms=1000, fps=4.0, backlogged=backlogged)
    policy = build(AdaptivePolicy, 8, default_rules=rules, service=fitted(0.02, 0.04))
    policy.add("file", 0, 0.0, "warm", 0.0)  # heard from: its rate counts
    policy.queues.take(1)
    assert policy.efficient_size() == 7  # smaller than the full batch it waits for
    fill(policy, [("file", 0.0)] * waiting)
    decision = policy.poll(0.0)
    assert len(decision.batch) == dispatched
    assert decision.wake_at == wake_at
    assert (policy.queues.arrival_rate(0.0) == math.inf) is backlogged


def test_a_hopeless_frame_does_not_shrink_a_batch_that_is_in_time() -> None:
    """The policy's own size stands when that many frames make it (not snapped down to a
    preferred size because one frame was already late alone)."""
    policy = build(
        AimdPolicy,
        8,
        preferred=(4, 8),
        rules={"late": CameraRules(max_frame_age_ms=10)},
        service=ServiceModel(a=0.02, c=0.0),
        timeout_s=0.0,
        latency_target_s=1.0,
    )
    policy.cap = 6.0
    policy.add("late", 0, 0.0, "late0", 0.0)  # due at 0.01; even alone it ends at 0.02
    fill(policy, [(f"c{i}", 0.0) for i in range(9)])
    decision = policy.poll(0.0)
    assert [d.frame.item for d in decision.dropped] == ["late0"]
    assert len(decision.batch) == 6
