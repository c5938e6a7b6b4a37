"""The re-measure policies as pure functions (``autotune.study.race``), and the re-measure
phase driving them on a real SQLite study with a stand-in pipeline (no servers): what is
stored decides the next restart, so an interrupted race resumes deterministically, and a
re-measurement another worker has claimed is left to it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from conftest_results import BASELINE_PARAMS, TrialSpec, make_study

from autotune.results import (
    best_estimate,
    config_estimates,
    load_remeasurements,
    remeasure_candidates,
    t975,
)
from autotune.study._optuna_compat import storage_of
from autotune.study.claims import claim, remeasure_claim_key
from autotune.study.context import StudyContext
from autotune.study.definition import RemeasureSettings, StudyDefinition
from autotune.study.journal import Journal
from autotune.study.objectives import Objective
from autotune.study.progress import NullProgress
from autotune.study.race import Arm, FixedPolicy, Noise, RacePolicy, ranked, winner
from autotune.study.remeasure import Remeasurer
from autotune.trial import TrialOutcome, TrialRecord
from autotune.trial.pipeline import Prepared

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def _race(
    policy: RacePolicy,
    true: dict[int, float],
    first: dict[int, float],
    *,
    sigma: float,
    seed: int = 0,
    noise: Noise | None = None,
    stored: Sequence[tuple[int, float]] = (),
    stop_after: int | None = None,
) -> tuple[list[tuple[int, float]], Any]:
    """Run a race to its end (or ``stop_after`` restarts): [(trial, value)] measured, and
    the last decision. ``stored``: re-measurements made before (a resumed race)."""
    values = {n: [v] for n, v in first.items()}
    repeats: dict[int, set[int]] = {n: set() for n in first}
    for n, v in stored:
        values[n].append(v)
        repeats[n].add(len(repeats[n]) + 1)
    rng = np.random.default_rng([seed, len(stored)])
    done: list[tuple[int, float]] = []
    while True:
        arms = [Arm(n, tuple(values[n]), frozenset(repeats[n])) for n in first]
        decision = policy.decide(arms, spent=len(stored) + len(done), noise=noise)
        if decision.stop or (stop_after is not None and len(done) >= stop_after):
            return done, decision
        assert decision.measure is not None  # not stopped
        n, r = decision.measure
        assert r == max(repeats[n], default=0) + 1
        v = true[n] * math.exp(rng.normal(0.0, sigma))
        values[n].append(v)
        repeats[n].add(r)
        done.append((n, v))


def test_a_separated_leader_stops_the_race_at_once() -> None:
    arms = [
        Arm(0, (800.0, 806.0)),
        Arm(1, (1000.0, 1004.0, 996.0), frozenset({1, 2})),
        Arm(2, (700.0,)),
    ]
    decision = RacePolicy(budget=10).decide(arms, spent=2)
    assert decision.stop and decision.leader == 1
    assert "separated" in decision.reason and "#0" in decision.reason


def test_close_candidates_get_the_repeats_and_the_clearly_behind_none() -> None:
    """Two configurations 0.5% apart, two 30% behind: with a known 3% noise every restart
    goes to the close pair, and the budget ends the race (they cannot be told apart)."""
    true = {0: 700.0, 1: 1000.0, 2: 995.0, 3: 690.0}
    first = {0: 702.0, 1: 1010.0, 2: 990.0, 3: 688.0}
    done, last = _race(RacePolicy(budget=8), true, first, sigma=0.03, noise=Noise(0.03, 40))
    assert len(done) == 8 and {n for n, _ in done} == {1, 2}
    assert last.stop and "budget" in last.reason and {last.leader, last.challenger} == {1, 2}
    # Alternating between the two: neither gets more than one restart ahead of the other.
    counts = [sum(1 for n, _ in done[:i] if n == 1) for i in range(1, 9)]
    assert all(abs(2 * c - i) <= 2 for i, c in zip(range(1, 9), counts, strict=True))


def test_the_budget_is_respected_and_counts_restarts_spent_before() -> None:
    true = {n: 1000.0 - n for n in range(6)}
    first = {n: 1000.0 + 3 * n for n in range(6)}
    for budget in (0, 1, 3, 7):
        done, last = _race(RacePolicy(budget=budget), true, first, sigma=0.05)
        assert len(done) == budget and last.stop and "budget" in last.reason
    decision = RacePolicy(budget=3).decide([Arm(0, (10.0,)), Arm(1, (10.5,))], spent=3)
    assert decision.stop and "3 of 3" in decision.reason


def test_the_indifference_zone_ends_a_race_between_equals() -> None:
    """Means 0.2% apart, tight intervals that still overlap: not separated, but neither can
    beat the other by more than 1%: either is fine. Without a zone the race goes on."""
    a = Arm(0, (1000.0, 1001.0, 999.0, 1000.5, 999.5, 1000.0))
    b = Arm(1, (998.0, 999.0, 997.0, 998.5, 997.5, 998.0))
    noise = Noise(0.002, 30)
    zone = RacePolicy(budget=20, indifference=0.01).decide([a, b], spent=0, noise=noise)
    assert zone.stop and zone.leader == 0 and "either is fine" in zone.reason
    strict = RacePolicy(budget=20, indifference=0.0).decide([a, b], spent=0, noise=noise)
    assert not strict.stop and strict.measure is not None


def test_without_a_noise_figure_the_top_single_run_is_measured_first() -> None:
    arms = [Arm(0, (900.0,)), Arm(1, (1000.0,)), Arm(2, (950.0,))]
    decision = RacePolicy(budget=3).decide(arms, spent=0)
    assert decision.measure == (1, 1) and decision.challenger == 2
    # then the challenger, which now has the wider interval
    arms[1] = Arm(1, (1000.0, 960.0), frozenset({1}))
    assert RacePolicy(budget=3).decide(arms, spent=1).measure == (2, 1)


def test_a_restart_in_flight_elsewhere_sends_the_next_one_to_the_other_candidate() -> None:
    arms = [Arm(0, (1000.0,), frozenset({1}), pending=1), Arm(1, (990.0,))]
    decision = RacePolicy(budget=4).decide(arms, spent=1)
    assert decision.leader == 0 and decision.measure == (1, 1)
    both = [Arm(0, (1000.0,), frozenset({1}), pending=1), Arm(1, (990.0,), frozenset({1}), 1)]
    assert RacePolicy(budget=4).decide(both, spent=2).measure == (0, 2)


def test_one_candidate_is_no_race() -> None:
    assert RacePolicy(budget=5).decide([Arm(3, (10.0,))], spent=0).stop
    assert RacePolicy(budget=5).decide([], spent=0).stop


def test_a_resumed_race_continues_exactly_where_it_stopped() -> None:
    """Stopped after k restarts and resumed from the stored measurements, the race takes the
    same decisions as the uninterrupted one (the draws are the same: measured values are
    what decides, nothing else)."""
    true = {n: 1000.0 * (1 - 0.004 * n) for n in range(8)}
    rng = np.random.default_rng(5)
    first = {n: v * math.exp(rng.normal(0, 0.05)) for n, v in true.items()}
    policy = RacePolicy(budget=9)
    whole, last = _race(policy, true, first, sigma=0.05, seed=1)
    for k in (1, 4, 8):
        head = whole[:k]
        values = {n: [v] for n, v in first.items()}
        repeats: dict[int, set[int]] = {n: set() for n in first}
        for n, v in head:
            values[n].append(v)
            repeats[n].add(len(repeats[n]) + 1)
        for n, v in whole[k:]:
            arms = [Arm(m, tuple(values[m]), frozenset(repeats[m])) for m in first]
            decision = policy.decide(arms, spent=sum(len(r) for r in repeats.values()))
            assert decision.measure is not None and decision.measure[0] == n
            values[n].append(v)
            repeats[n].add(decision.measure[1])
        arms = [Arm(m, tuple(values[m]), frozenset(repeats[m])) for m in first]
        assert policy.decide(arms, spent=len(whole)) == last


def test_the_leader_is_bests_ranking_and_the_t_quantile_is_bests_at_95() -> None:
    """``ranked`` orders by the reported 95% lower bound with the pooled noise, so a lucky
    single run (1000) loses to 985 measured twice, as ``best`` ranks them."""
    arms = [Arm(0, (1000.0,)), Arm(1, (980.0, 990.0), frozenset({1})), Arm(2, (500.0, 520.0))]
    noise = Noise.pooled(arms)
    assert noise.df == 2 and noise.sd is not None
    assert [a.number for a in ranked(arms)] == [1, 0, 2]
    lower0 = 1000.0 - t975(2) * noise.sd * 1000.0
    lower1 = 985.0 - t975(2) * noise.sd * 985.0 / math.sqrt(2)
    assert lower1 > lower0
    assert RacePolicy(budget=1).decide(arms, spent=1).leader == 1
    assert RacePolicy(budget=1, confidence=0.8).decide(arms, spent=1).leader == 1
    assert winner(arms) == arms[1]


def test_fixed_policy_is_todays_top_k_round_by_round() -> None:
    arms = [Arm(0, (900.0,)), Arm(1, (1000.0,), frozenset({1})), Arm(2, (950.0,)), Arm(3, (5.0,))]
    policy = FixedPolicy(top_k=3, repeats=2)
    # by mean: #1, #2, #0 (#3 is 4th); repeat 1 of #1 is stored already
    assert policy.plan(arms) == [(2, 1), (0, 1), (1, 2), (2, 2), (0, 2)]
    assert policy.decide(arms, spent=0).measure == (2, 1)
    assert policy.decide(arms, spent=policy.limit).stop
    assert FixedPolicy(top_k=0, repeats=2).decide(arms, spent=0).stop


# --- the re-measure phase on a stored study ---------------------------------------------


class _Space:
    def complete(self, config: dict[str, Any]) -> dict[str, Any]:
        return dict(config)


class _Pipeline:
    """Measures a configuration as its true value x a draw fixed by (config, call)."""

    def __init__(self, true: Callable[[dict[str, Any]], float], *, interrupt_at: int = 0):
        self.true = true
        self.calls: list[dict[str, Any]] = []
        self.interrupt_at = interrupt_at

    def prepare(self, config: dict[str, Any], *, is_baseline: bool) -> Prepared:
        """No services: nothing inherited is known, so the race never stops for it."""
        return Prepared(config=config, specs={}, record=TrialRecord(config=config))

    def evaluate(self, config: dict[str, Any], *, is_baseline: bool, fresh: bool) -> TrialOutcome:
        assert fresh and not is_baseline
        self.calls.append(config)
        if self.interrupt_at and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        key = (round(1000 * float(config["mem_fraction_static"])), _seen(self.calls, config))
        value = self.true(config) * math.exp(np.random.default_rng(key).normal(0.0, 0.05))
        metrics = {"output_throughput": value, "tpot_ms": {"p99": 20.0}}
        record = TrialRecord(metrics=metrics, phase_seconds={"restart": 1.0, "measure": 1.0})
        return TrialOutcome(values=[value], constraints={"feasible": 0.0}, record=record)


def _seen(calls: list[dict[str, Any]], config: dict[str, Any]) -> int:
    return sum(1 for c in calls if c == config)


def _mem(v: float) -> dict[str, Any]:
    return {**BASELINE_PARAMS, "mem_fraction_static": v}


TRUE = {0.70: 1000.0, 0.71: 995.0, 0.72: 990.0, 0.73: 800.0, 0.74: 700.0}


def _true(config: dict[str, Any]) -> float:
    return TRUE[round(float(config["mem_fraction_static"]), 2)]


def _study(tmp_path: Path, name: str = "s") -> optuna.Study:
    """Five configurations: three within 1% of each other, two clearly behind; each trial's
    own run 2% off its true value (up, down, none)."""
    specs = [
        TrialSpec(throughput=t * 1.02 ** (i % 3 - 1), params=_mem(m))
        for i, (m, t) in enumerate(TRUE.items())
    ]
    return make_study(tmp_path / name, specs)


def _remeasurer(
    study: optuna.Study,
    tmp_path: Path,
    pipeline: _Pipeline | _CapacityPipeline,
    settings: RemeasureSettings,
    *,
    worker: str = "w1",
    shared: bool = False,
) -> Remeasurer:
    definition = StudyDefinition(
        name="s", space=Path("a.yaml"), deployment=Path("b.yaml"), remeasure=settings
    )
    url = "sqlite:///unused.db"
    ctx = StudyContext(
        study=study,
        storage=storage_of(study),
        storage_url=url,
        definition=definition,
        space=_Space(),  # type: ignore[arg-type]
        objective=Objective(kind="throughput", slo=definition.slo),
        progress=NullProgress(),
        journal=Journal(tmp_path / worker / "journal", storage_url=url, study_name="s"),
        remeasure_journal=Journal(
            tmp_path / worker / "journal", storage_url=url, study_name="s#remeasure"
        ),
        worker_name=worker,
        shared=shared,
    )
    return Remeasurer(ctx, pipeline, report=lambda *_: None)  # type: ignore[arg-type]


def _stored(study: optuna.Study) -> list[tuple[int, int, float | None]]:
    return [(m.of, m.repeat, m.throughput) for m in load_remeasurements(study)]


def test_the_phase_races_within_its_budget_and_best_reports_the_races_leader(
    tmp_path: Path,
) -> None:
    study = _study(tmp_path)
    pipeline = _Pipeline(_true)
    phase = _remeasurer(study, tmp_path, pipeline, RemeasureSettings(budget=6))
    phase.run(target=5)
    stored = load_remeasurements(study)
    assert 1 <= len(stored) <= 6 and len(pipeline.calls) == len(stored)
    assert {m.of for m in stored} <= {0, 1, 2}  # 800 and 700 are clearly behind
    assert all(m.target == 5 for m in stored)
    assert phase.decision is not None and phase.decision.stop
    best = best_estimate(study)
    assert best is not None and best.trial.number == phase.decision.leader
    # The same target again: nothing more to do; a larger one races on with a new budget
    # (unless the race was decided, which the same measurements decide again).
    reason = phase.decision.reason
    phase.run(target=5)
    assert len(load_remeasurements(study)) == len(stored)
    phase.run(target=6)
    again = load_remeasurements(study)
    if "budget" in reason:
        assert len(stored) < len(again) <= len(stored) + 6
    assert sum(1 for m in again if m.target == 6) == len(again) - len(stored)


def test_an_interrupted_race_resumes_with_the_same_decisions(tmp_path: Path) -> None:
    whole = _study(tmp_path, "whole")
    reference = _Pipeline(_true)
    _remeasurer(whole, tmp_path, reference, RemeasureSettings(budget=6)).run(target=5)
    expected = _stored(whole)
    assert len(expected) >= 3
    for cut in (2, len(expected)):
        study = _study(tmp_path, f"cut{cut}")
        pipeline = _Pipeline(_true, interrupt_at=cut)
        phase = _remeasurer(study, tmp_path, pipeline, RemeasureSettings(budget=6))
        with pytest.raises(KeyboardInterrupt):
            phase.run(target=5)
        # the one cut short stored nothing; the ones before it are stored
        assert pipeline.calls[:cut] == reference.calls[:cut]
        assert len(_stored(study)) == cut - 1
        pipeline.interrupt_at = 0
        pipeline.calls = pipeline.calls[:-1]  # that measurement never happened
        phase.run(target=5)
        assert pipeline.calls == reference.calls and _stored(study) == expected
        assert best_estimate(study).trial.number == best_estimate(whole).trial.number  # type: ignore[union-attr]


def test_a_re_measurement_claimed_by_another_worker_is_left_to_it(tmp_path: Path) -> None:
    """Two workers on one study: w2 holds the first re-measurement the race asks for; w1
    does not launch it, counts it against the budget and races the rest around it. A claim
    w1 itself left (an interrupted run of the same worker) is its own again."""
    study = _study(tmp_path)
    settings = RemeasureSettings(budget=4)
    first = _remeasurer(study, tmp_path, _Pipeline(_true), settings).decide(set(), runs=0)[0]
    assert first.measure is not None
    number, repeat = first.measure
    assert claim(study, remeasure_claim_key(number, repeat), 12345).won
    pipeline = _Pipeline(_true)
    phase = _remeasurer(study, tmp_path, pipeline, settings, shared=True)
    second = phase.decide(set(), runs=0)[0]
    assert second.measure is not None and second.measure != first.measure
    assert claim(study, remeasure_claim_key(*second.measure), phase.owner).won  # w1's own
    phase.run(target=5)
    stored = {(m.of, m.repeat) for m in load_remeasurements(study)}
    assert (number, repeat) not in stored and second.measure in stored
    assert len(stored) == 3  # 4 restarts, one of them in flight elsewhere
    assert len(pipeline.calls) == 3
    assert phase.decision is not None and phase.decision.stop and "budget" in phase.decision.reason


def test_the_fixed_policy_keeps_todays_plan(tmp_path: Path) -> None:
    """policy: fixed measures the top-2 by mean round by round, drawing the top-2 again
    after every run, until the top-2 (by mean over all their runs) have 2 re-measurements
    each: what the phase did before the race."""
    study = _study(tmp_path)
    pipeline = _Pipeline(_true)
    settings = RemeasureSettings(policy="fixed", top_k=2, repeats=2)
    phase = _remeasurer(study, tmp_path, pipeline, settings)
    first = [(n, r) for n, r, _ in phase.plan()]
    top2 = [e.trial.number for e in remeasure_candidates(study, 2)]
    assert first == [(top2[0], 1), (top2[1], 1), (top2[0], 2), (top2[1], 2)]
    phase.run(target=5)
    stored = load_remeasurements(study)
    assert 4 <= len(stored) <= 12 and len(pipeline.calls) == len(stored)
    for e in remeasure_candidates(study, 2):
        assert sorted(m.repeat for m in e.measurements if m.repeat) == [1, 2]
    assert phase.plan() == [] and phase.decision is not None and phase.decision.stop


def _capacity(value: float) -> dict[str, Any]:
    """A capacity search's stored result: passed at ``value``, failed at the next point."""
    return {"over": "rate", "capacity": value, "upper": value * 1.414, "probes": 7}


class _CapacityPipeline:
    """Every configuration reads 64.0 req/s from the bracket [64.0, 90.5): the bisection
    grid repeats its points, so repeats agree exactly."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def prepare(self, config: dict[str, Any], *, is_baseline: bool) -> Prepared:
        """No services: nothing inherited is known, so the race never stops for it."""
        return Prepared(config=config, specs={}, record=TrialRecord(config=config))

    def evaluate(self, config: dict[str, Any], *, is_baseline: bool, fresh: bool) -> TrialOutcome:
        self.calls.append(config)
        record = TrialRecord(metrics={"tpot_ms": {"p99": 20.0}}, capacity=_capacity(64.0))
        return TrialOutcome(values=[64.0], constraints={"feasible": 0.0}, record=record)


def test_a_capacity_bracket_is_a_noise_floor_equal_readings_are_not_exact(
    tmp_path: Path,
) -> None:
    """Equal capacities measured again pooled to 0% noise: an interval of zero width, and the
    race stopped after one restart as if 64.0 were exact. The bracket's width (41%) is what
    a reading cannot resolve: the noise is at least 41% / sqrt(12) = 12%."""
    specs = [
        TrialSpec(throughput=64.0, params=_mem(m), attrs={"capacity": _capacity(64.0)})
        for m in (0.70, 0.71)
    ]
    study = make_study(tmp_path / "cap", specs)
    pipeline = _CapacityPipeline()
    phase = _remeasurer(study, tmp_path, pipeline, RemeasureSettings(budget=4))
    phase.run(target=2)
    stored = load_remeasurements(study)
    assert all(m.resolution == pytest.approx(0.414) for m in stored)
    # indistinguishable at the reading's resolution: the race spends its budget
    assert len(stored) == 4 and {m.of for m in stored} == {0, 1}
    assert phase.decision is not None and "budget" in phase.decision.reason
    est = {e.trial.number: e for e in config_estimates(study)}
    assert est[0].noise_sd == pytest.approx(0.414 / math.sqrt(12))
    assert est[0].half_width is not None and est[0].half_width > 0.1 * 64.0
