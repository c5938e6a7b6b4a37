"""Planner: what an explanation measures next, and what the measurements say.

Driven by a replay of the explain loop (``explain_replay``): synthetic runs whose values are
a known pure function of the configuration times seeded 2% multiplicative noise, so every
change's true contribution is known. No servers, no study.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from explain_replay import Config, explain, planner_for, replay
from explain_spaces import bool_levers, env_lever, make_space

from autotune.explain import ExplainSettings, Finished
from autotune.space import SearchSpace

SEEDS = range(10)
ALL_ON = {"fast": True, "noop": True, "mid": True}


def three_levers(c: Config) -> float:
    """fast doubles the throughput, mid adds 25%, noop does nothing."""
    return 100.0 * (2.0 if c["fast"] else 1.0) * (1.25 if c["mid"] else 1.0)


@pytest.fixture()
def levers(tmp_path: Path) -> SearchSpace:
    return bool_levers(tmp_path, ["fast", "noop", "mid"])


def _covers(interval: object, truth: float) -> bool:
    low, high = getattr(interval, "low", None), getattr(interval, "high", None)
    assert low is not None and high is not None
    return bool(low <= truth <= high)


# --------------------------------------------------------------------------- the effects


def test_a_lever_that_does_nothing_is_within_noise_and_dropped_a_large_one_is_kept(
    levers: SearchSpace,
) -> None:
    true_winner = three_levers(ALL_ON)
    true_fast = true_winner - three_levers({**ALL_ON, "fast": False})  # 250 - 125
    true_mid = true_winner - three_levers({**ALL_ON, "mid": False})  # 250 - 200
    noop_covered = noop_dropped = fast_covered = mid_covered = 0
    for seed in SEEDS:
        planner = planner_for(levers, ALL_ON)
        result = replay(planner, three_levers, seed=seed)
        assert result.finished == "done"
        e = explain(planner, result)
        assert e.complete and e.stopped is None and e.runs == len(result.measured)
        effects = {x.change: x for x in e.effects}
        assert list(effects) == ["fast", "noop", "mid"]  # declaration order
        fast, noop, mid = effects["fast"], effects["noop"], effects["mid"]
        assert fast.contribution is not None and noop.contribution is not None
        assert mid.contribution is not None
        # the large effect: right sign, kept, the first in the frozen order
        assert fast.contribution.value > 0 and fast.contribution.low is not None
        assert fast.contribution.low > 0
        assert fast.relative is not None and 0.4 < fast.relative < 0.6
        assert result.state.order is not None and result.state.order[0] == "fast"
        assert e.minimal is not None and e.minimal.complete
        assert "fast" in e.minimal.kept and "mid" in e.minimal.kept
        fast_covered += _covers(fast.contribution, true_fast)
        mid_covered += _covers(mid.contribution, true_mid)
        noop_covered += _covers(noop.contribution, 0.0)
        noop_dropped += e.minimal.dropped == ["noop"]
        assert not any(x.required for x in e.effects)
    # 95% intervals over 10 seeds: a miss or two is chance, three would be a bug
    assert fast_covered >= 8 and mid_covered >= 8
    assert noop_covered >= 8
    assert noop_dropped >= 8


def test_the_minimal_winner_is_the_winner_without_the_dropped_change(
    levers: SearchSpace,
) -> None:
    planner = planner_for(levers, ALL_ON)
    result = replay(planner, three_levers, seed=1)
    e = explain(planner, result)
    assert e.minimal is not None and e.minimal.dropped == ["noop"]
    assert e.minimal.config == {"fast": True, "noop": False, "mid": True}
    assert e.minimal.measured.key == levers.config_key(e.minimal.config)
    assert [d.change for d in e.minimal.decisions] == ["noop", "mid", "fast"]  # smallest first
    assert [d.action for d in e.minimal.decisions] == ["dropped", "kept", "kept"]
    assert e.minimal.ratio is not None and 0.95 < e.minimal.ratio.value < 1.05
    # the noise is what the replay put in: 2%, pooled over every configuration
    assert e.noise_sd is not None and 0.01 < e.noise_sd < 0.03
    assert e.noise_df == sum(len(r) - 1 for r in result.runs.values())


# --------------------------------------------------------------------------- failures


def test_a_revert_that_fails_is_measured_once_required_and_kept_first(tmp_path: Path) -> None:
    space = bool_levers(tmp_path, ["noop", "fast", "mem"])

    def truth(c: Config) -> float | None:
        if c["fast"] and not c["mem"]:
            return None  # the fast path needs the memory setting: OOM at start-up
        return 100.0 * (2.0 if c["fast"] else 1.0)

    winner = {"noop": True, "fast": True, "mem": True}
    for seed in range(3):
        planner = planner_for(space, winner)
        result = replay(planner, truth, seed=seed)
        without_mem = planner.reverts["mem"][0]
        assert without_mem.key is not None
        assert [r.failure for r in result.runs[without_mem.key]] == ["cuda_oom"]  # once only
        e = explain(planner, result)
        mem = next(x for x in e.effects if x.change == "mem")
        assert mem.required and mem.contribution is None
        assert mem.without.failure == "cuda_oom: CUDA out of memory" and mem.without.n == 0
        assert result.state.order is not None and result.state.order[0] == "mem"
        assert e.minimal is not None and "mem" in e.minimal.kept
        decision = next(d for d in e.minimal.decisions if d.change == "mem")
        assert decision.action == "kept" and "fails (cuda_oom" in decision.why
        # the other configurations ran their repeats
        for key in (planner.winner.key, planner.baseline.key):
            assert key is not None and len(result.runs[key]) >= 3


def test_a_revert_that_breaks_an_slo_in_most_runs_is_required(tmp_path: Path) -> None:
    space = bool_levers(tmp_path, ["fast", "guard"])

    def truth(c: Config) -> tuple[float, bool]:
        # without the guard the latency SLO breaks, yet the throughput is the same
        return 100.0 * (2.0 if c["fast"] else 1.0), bool(c["guard"] or not c["fast"])

    planner = planner_for(space, {"fast": True, "guard": True})
    result = replay(planner, truth, seed=4)
    e = explain(planner, result)
    guard = next(x for x in e.effects if x.change == "guard")
    assert guard.required and guard.without.infeasible == guard.without.n == 3
    assert result.state.order == ["guard", "fast"]
    assert e.minimal is not None and e.minimal.kept == ["fast", "guard"]
    assert "break an SLO" in next(d.why for d in e.minimal.decisions if d.change == "guard")


def test_a_change_that_cannot_be_reverted_is_last_and_not_measured_alone(
    tmp_path: Path,
) -> None:
    space = make_space(
        tmp_path,
        {n: env_lever(n, type="bool") for n in ("core", "left", "right")},
        forbidden=[
            {"name": "needs_core", "when": "not core and (left or right)", "reason": "core"}
        ],
        baseline={"core": False, "left": False, "right": False},
    )

    def truth(c: Config) -> float:
        return 100.0 * (1.5 if c["core"] else 1.0) * (1.5 if c["left"] else 1.0)

    planner = planner_for(space, {"core": True, "left": True, "right": True})
    result = replay(planner, truth, seed=2)
    assert result.finished == "done"
    assert result.state.order is not None and result.state.order[-1] == "core"
    e = explain(planner, result)
    core = next(x for x in e.effects if x.change == "core")
    assert core.contribution is None and core.without.key is None and not core.required
    assert core.note is not None and core.note.startswith("cannot be reverted")
    assert e.minimal is not None and e.minimal.dropped == ["right"]  # right does nothing
    kept = next(d for d in e.minimal.decisions if d.change == "core")
    assert kept.action == "kept" and "refused" in kept.why and kept.key is None
    # measured: the winner, the baseline and the two reverts; once right is dropped, left
    # is kept from its revert alone (0.67 of the winner, confidently below the tolerance)
    # without a restart; the path's steps are all refused (no core)
    assert len(result.runs) == 4
    left = next(d for d in e.minimal.decisions if d.change == "left")
    assert left.action == "kept" and "not measured again" in left.why
    assert e.path and e.path[0].added == result.state.order


def test_a_winner_that_fails_from_fresh_services_drops_nothing(tmp_path: Path) -> None:
    space = bool_levers(tmp_path, ["fast", "noop"])

    def truth(c: Config) -> float | None:
        return None if c["fast"] and c["noop"] else 100.0 * (2.0 if c["fast"] else 1.0)

    planner = planner_for(space, {"fast": True, "noop": True})
    result = replay(planner, truth, seed=0)
    assert result.finished is not None and result.finished.startswith("the winner fails")
    assert planner.winner.key is not None
    assert [r.failure for r in result.runs[planner.winner.key]] == ["cuda_oom"]
    e = explain(planner, result)
    assert e.minimal is not None and e.minimal.dropped == [] and not e.minimal.complete
    assert not e.complete
    assert all(x.contribution is None for x in e.effects)


# --------------------------------------------------------------------------- the order


def test_the_ablation_goes_round_by_round(levers: SearchSpace) -> None:
    planner = planner_for(levers, ALL_ON, ExplainSettings(repeats=3, max_repeats=6))
    result = replay(planner, three_levers, seed=0)
    keys = [planner.winner.key, planner.baseline.key]
    keys += [planner.reverts[n][0].key for n in ("fast", "noop", "mid")]
    assert len(set(keys)) == 5
    first = result.measured[:15]
    assert [m.key for m in first] == keys * 3
    assert {m.phase for m in first} == {"ablation"}
    assert [m.why for m in first[:5]] == [
        "the winner, run 1",
        "the baseline, run 1",
        "the winner without fast, run 1",
        "the winner without noop, run 1",
        "the winner without mid, run 1",
    ]
    assert first[5].why == "the winner, run 2" and first[14].why == "the winner without mid, run 3"
    assert result.decided[0].startswith("changes by measured contribution: fast, mid, noop")
    assert all(m.phase != "ablation" for m in result.measured[15:])


def test_a_failed_configuration_drops_out_of_the_rounds(tmp_path: Path) -> None:
    space = bool_levers(tmp_path, ["a", "b"])
    planner = planner_for(space, {"a": True, "b": True}, ExplainSettings(repeats=2))
    result = replay(planner, lambda c: None if not c["a"] and c["b"] else 100.0, seed=0)
    w, base = planner.winner.key, planner.baseline.key
    without_a, without_b = planner.reverts["a"][0].key, planner.reverts["b"][0].key
    assert [m.key for m in result.measured[:7]] == [
        w,
        base,
        without_a,
        without_b,
        w,
        base,
        without_b,
    ]


def test_resuming_measures_exactly_what_an_uninterrupted_run_does(levers: SearchSpace) -> None:
    settings = ExplainSettings(repeats=2, max_repeats=4)
    whole = replay(planner_for(levers, ALL_ON, settings), three_levers, seed=8)
    total = len(whole.measured)
    assert total > 12  # ablation (10), the path, the elimination
    for k in (1, 5, 10, 11, total - 1):
        first = replay(planner_for(levers, ALL_ON, settings), three_levers, seed=8, budget=k)
        assert len(first.measured) == k and first.finished is None
        # a fresh planner over what was stored, as the next `autotune explain` builds it
        planner = planner_for(levers, ALL_ON, settings)
        rest = replay(planner, three_levers, seed=8, runs=first.runs, state=first.state)
        assert [(m.key, m.phase) for m in first.measured + rest.measured] == [
            (m.key, m.phase) for m in whole.measured
        ]
        assert rest.state == whole.state
        assert explain(planner, rest) == explain(planner, whole)
    # a spent budget stops before measuring; the stored explanation says so
    planner = planner_for(levers, ALL_ON, settings)
    stopped = replay(planner, three_levers, seed=8, budget=4)
    partial = planner.explanation(
        stopped.runs, stopped.state, unit="tok/s", objective="x", stopped="the budget"
    )
    assert not partial.complete and partial.stopped == "the budget" and partial.runs == 4
    assert partial.minimal is None and partial.path == []  # the order is not frozen yet


def test_a_close_elimination_takes_more_runs_but_at_most_max_repeats(tmp_path: Path) -> None:
    space = bool_levers(tmp_path, ["fast", "close"])
    settings = ExplainSettings(repeats=2, max_repeats=5, tolerance=0.03)

    def truth(c: Config) -> float:
        # without `close` the throughput is exactly at the tolerance: 97% of the winner's
        return 100.0 * (2.0 if c["fast"] else 1.0) * (1.0 / 0.97 if c["close"] else 1.0)

    extended = 0
    for seed in range(6):
        planner = planner_for(space, {"fast": True, "close": True}, settings)
        result = replay(planner, truth, seed=seed)
        assert result.state.order == ["fast", "close"]
        candidate = planner.reverts["close"][0].key
        assert candidate is not None and planner.winner.key is not None
        n = len(result.runs[candidate])
        assert settings.repeats <= n <= settings.max_repeats
        assert len(result.runs[planner.winner.key]) <= 2 * settings.max_repeats
        extended += n > settings.repeats
        minimal_runs = [m for m in result.measured if m.phase == "minimal"]
        assert {m.key for m in minimal_runs} <= {candidate, planner.winner.key}
        decision = explain(planner, result).minimal
        assert decision is not None and decision.complete
    assert extended >= 5  # straddling the tolerance is what "close" means


def test_the_winner_equal_to_the_baseline_has_nothing_to_measure(levers: SearchSpace) -> None:
    planner = planner_for(levers, levers.baseline_params())
    state = planner.new_state()
    step = planner.next({}, state)
    assert isinstance(step, Finished) and "nothing to explain" in step.why
    e = planner.explanation({}, state, unit="tok/s", objective="x")
    assert e.complete and e.effects == [] and e.path == []


# --------------------------------------------------------------------------- the path


def test_the_path_adds_changes_in_the_frozen_order_and_sums_to_the_gain(
    levers: SearchSpace,
) -> None:
    planner = planner_for(levers, ALL_ON)
    result = replay(planner, three_levers, seed=3)
    e = explain(planner, result)
    assert result.state.order == ["fast", "mid", "noop"]
    assert [s.added for s in e.path] == [["fast"], ["mid"], ["noop"]]
    assert e.path[-1].measured.key == planner.winner.key == e.winner_measured.key
    assert e.path[0].measured.key == levers.config_key({"fast": True, "noop": False, "mid": False})
    assert all(s.measured.n >= 3 and s.note is None for s in e.path)  # minimal adds some
    steps = [s.step for s in e.path]
    assert all(s is not None for s in steps)
    assert e.winner_measured.mean is not None and e.baseline_measured.mean is not None
    gain = e.winner_measured.mean.value - e.baseline_measured.mean.value
    assert math.isclose(sum(s.value for s in steps if s), gain, rel_tol=1e-9)
    # the path's own runs come after the ablation, `repeats` each; a configuration the
    # ablation measured (baseline + fast + mid is the winner without noop) is not run again
    assert e.path[1].measured.key == planner.reverts["noop"][0].key
    path_runs = [m for m in result.measured if m.phase == "path"]
    assert [m.key for m in path_runs] == [e.path[0].measured.key] * 3
    assert result.measured.index(path_runs[0]) == 15


def test_a_step_the_space_refuses_is_merged_into_the_next(tmp_path: Path) -> None:
    space = make_space(
        tmp_path,
        {
            "kernel": env_lever("kernel", type="categorical", choices=["slow", "fast"]),
            "layout": env_lever("layout", type="categorical", choices=["old", "new"]),
            "extra": env_lever("extra", type="bool"),
        },
        forbidden=[
            {
                "name": "fast_needs_new_layout",
                "when": "kernel == 'fast' and layout == 'old'",
                "reason": "the fast kernel reads the new layout only",
            }
        ],
        baseline={"kernel": "slow", "layout": "old", "extra": False},
    )

    def truth(c: Config) -> float:
        return (
            100.0
            * (3.0 if c["kernel"] == "fast" else 1.0)
            * (0.7 if c["layout"] == "new" else 1.0)
            * (1.3 if c["extra"] else 1.0)
        )

    planner = planner_for(space, {"kernel": "fast", "layout": "new", "extra": True})
    result = replay(planner, truth, seed=5)
    e = explain(planner, result)
    layout = next(x for x in e.effects if x.change == "layout")
    assert layout.reverted == ["layout", "kernel"]
    assert layout.note is not None and "reverted together with kernel" in layout.note
    assert result.state.order == ["kernel", "layout", "extra"]
    assert [s.added for s in e.path] == [["kernel", "layout"], ["extra"]]
    assert e.path[0].note is not None and e.path[0].note.startswith("kernel alone is refused")
    assert e.winner_measured.mean is not None and e.baseline_measured.mean is not None
    gain = e.winner_measured.mean.value - e.baseline_measured.mean.value
    assert math.isclose(sum(s.step.value for s in e.path if s.step), gain, rel_tol=1e-9)


def test_no_path_no_minimal_is_the_ablation_only(levers: SearchSpace) -> None:
    settings = ExplainSettings(repeats=2, path=False, minimal=False)
    planner = planner_for(levers, ALL_ON, settings)
    result = replay(planner, three_levers, seed=0)
    assert len(result.measured) == 5 * 2 and result.finished == "done"
    e = explain(planner, result)
    assert e.complete and e.path == [] and e.minimal is None


def test_a_transient_failure_is_retried_once_then_final(tmp_path: Path) -> None:
    """A process killed under it (``exited``) says nothing of the configuration: the
    configuration is run again, and only a second such failure makes it final."""
    from autotune.explain import ExplainRun, Measure

    space = bool_levers(tmp_path, ["fast", "noop"])
    planner = planner_for(space, {"fast": True, "noop": True}, ExplainSettings(repeats=1))
    state = planner.new_state()
    winner, baseline = planner.winner, planner.baseline
    without_fast = planner.reverts["fast"][0]
    assert winner.key and baseline.key and without_fast.key

    def ok(key: str, index: int) -> ExplainRun:
        return ExplainRun(key=key, index=index, values=[100.0], feasible=True)

    def killed(key: str, index: int) -> ExplainRun:
        return ExplainRun(key=key, index=index, failure="exited", reason="router: -15")

    runs = {
        winner.key: [ok(winner.key, 0)],
        baseline.key: [ok(baseline.key, 0)],
        without_fast.key: [killed(without_fast.key, 0)],
    }
    step = planner.next(runs, state)
    assert isinstance(step, Measure) and step.key == without_fast.key  # tried again
    runs[without_fast.key].append(killed(without_fast.key, 1))
    e = planner.explanation(runs, state, unit="tok/s", objective="output throughput")
    fast = next(x for x in e.effects if x.change == "fast")
    assert fast.required and fast.without.failure is not None
    assert "2 of 2 runs failed" in fast.without.failure
    step = planner.next(runs, state)
    assert not (isinstance(step, Measure) and step.key == without_fast.key)  # final now


def test_a_capacity_brackets_width_is_the_noise_floor(levers: SearchSpace) -> None:
    """Capacities read off a bisection grid repeat exactly; the pooled noise must not be 0."""
    from autotune.explain.record import ExplainRun

    planner = planner_for(levers, ALL_ON)
    bracket = {"over": "rate", "capacity": 64.0, "upper": 90.5}
    runs = {
        key: [
            ExplainRun(key=key, index=i, values=[64.0], feasible=True, capacity=bracket)
            for i in range(2)
        ]
        for key in ("a", "b")
    }
    sd, df = planner.noise(runs)
    assert df == 2 and sd == pytest.approx((90.5 / 64.0 - 1) / math.sqrt(12))
    plain = {k: [r.model_copy(update={"capacity": None}) for r in rs] for k, rs in runs.items()}
    assert planner.noise(plain) == (0.0, 2)
