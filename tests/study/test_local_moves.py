"""The default sampler's planned moves put last the single-lever changes that cost half the
objective or more each time they were made (``_local_moves._harmful_changes``): on the real
GPU studies `--enforce-eager` was tried again from every new best and lost 79-99% each time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial
from sampler_helpers import quiet_optuna  # noqa: F401

from autotune.study import samplers
from autotune.study._crash_aware import _failed_numbers
from autotune.study._local_moves import HARMFUL, _harmful_changes, _lever_moves

REPO = Path(__file__).resolve().parents[2]
MAX = [StudyDirection.MAXIMIZE]
DISTS = {
    "eager": CategoricalDistribution([False, True]),
    "cache": CategoricalDistribution(["on", "off"]),
    "quant": CategoricalDistribution(["none", "fp8", "int8"]),
    "seqs": IntDistribution(8, 264, step=8),
}

pytestmark = pytest.mark.usefixtures("quiet_optuna")


def _trial(
    number: int,
    params: dict[str, Any],
    values: list[float],
    move: tuple[str, int] | None = None,
    feasible: bool = True,
) -> FrozenTrial:
    attrs: dict[str, Any] = {"constraints:feasible": 0.0 if feasible else 1.0}
    if move:
        attrs[samplers.MOVE_ATTR] = list(move)
    t = create_trial(
        params=params,
        distributions={k: DISTS[k] for k in params},
        values=values,
        system_attrs=attrs,
    )
    t.number = number
    return t


BASE = {"eager": False, "cache": "on", "quant": "none", "seqs": 128}


def test_a_change_that_cost_more_than_half_is_harmful_and_its_undoing_too() -> None:
    trials = [
        _trial(0, BASE, [1000.0]),
        _trial(1, {**BASE, "eager": True}, [210.0], move=("eager", 0)),  # -79%
        _trial(2, {**BASE, "cache": "off"}, [1100.0], move=("cache", 0)),  # +10%
        _trial(3, {**BASE, "quant": "fp8"}, [2400.0], move=("quant", 0)),  # +140%
    ]
    harmful = _harmful_changes(trials, set(), MAX)
    assert ("eager", False, True) in harmful
    # Undoing a move that gained 140% costs 1 - 1/2.4 = 58%: harmful the other way round.
    assert ("quant", "fp8", "none") in harmful
    assert ("quant", "none", "fp8") not in harmful
    # Small changes either way, and the undoing of a harmful change, are not harmful.
    assert ("cache", "on", "off") not in harmful and ("cache", "off", "on") not in harmful
    assert ("eager", True, False) not in harmful
    assert harmful == {("eager", False, True), ("quant", "fp8", "none")}


def test_a_change_seen_once_to_cost_less_is_not_harmful() -> None:
    """Interactions exist: a change that was cheap from one incumbent is not put last."""
    trials = [
        _trial(0, BASE, [1000.0]),
        _trial(1, {**BASE, "eager": True}, [210.0], move=("eager", 0)),
        _trial(2, {**BASE, "cache": "off"}, [1100.0], move=("cache", 0)),
        _trial(3, {**BASE, "cache": "off", "eager": True}, [900.0], move=("eager", 2)),
    ]
    assert ("eager", False, True) not in _harmful_changes(trials, set(), MAX)
    # At exactly the threshold it is harmful; just under, it is not.
    edge = [
        _trial(0, BASE, [1000.0]),
        _trial(1, {**BASE, "eager": True}, [1000.0 * (1 - HARMFUL)], move=("eager", 0)),
    ]
    assert ("eager", False, True) in _harmful_changes(edge, set(), MAX)
    edge[1] = _trial(1, {**BASE, "eager": True}, [1000.0 * (1 - HARMFUL) + 1], move=("eager", 0))
    assert _harmful_changes(edge, set(), MAX) == set()


def test_infeasible_trials_and_other_objectives_are_no_evidence_of_cost() -> None:
    trials = [
        _trial(0, BASE, [1000.0, 50.0]),
        # Throughput -80% but latency halved: not worse on every objective.
        _trial(1, {**BASE, "eager": True}, [200.0, 25.0], move=("eager", 0)),
        # Infeasible (the crash-aware guards handle those): no cost recorded.
        _trial(2, {**BASE, "seqs": 256}, [0.0, 1e9], move=("seqs", 0), feasible=False),
        # Worse on both: harmful.
        _trial(3, {**BASE, "cache": "off"}, [400.0, 120.0], move=("cache", 0)),
    ]
    directions = [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    harmful = _harmful_changes(trials, _failed_numbers(trials), directions)
    assert harmful == {("cache", "on", "off")}


def test_harmful_changes_come_after_every_other_planned_move() -> None:
    best = _trial(5, BASE, [1000.0])
    harmful = {("eager", False, True), ("seqs", 128, 192)}
    for seed in range(20):
        moves = list(_lever_moves(best, np.random.default_rng(seed), {}, {}, harmful))
        levers = [(lever, params[lever]) for lever, params in moves if lever is not None]
        assert set(levers[-2:]) == {("eager", True), ("seqs", 192)}, seed
        assert len(levers) == len(set(levers))
        # Without the set: the same moves, in another order.
        plain = [
            (lv, p[lv])
            for lv, p in _lever_moves(best, np.random.default_rng(seed), {}, {})
            if lv is not None
        ]
        assert sorted(plain, key=str) == sorted(levers, key=str)


@pytest.mark.parametrize(
    ("name", "db", "number", "change"),
    [
        ("vllm-h100-moe", "h100/vllm-h100-moe.db", 24, ("enforce_eager", False, True)),
        ("vllm-h200-dense", "h200/vllm-h200-dense.db", 16, ("enforce_eager", False, True)),
    ],
)
def test_the_restarts_the_gpu_studies_spent_on_a_known_loss_are_now_deferred(
    name: str, db: str, number: int, change: tuple[str, Any, Any]
) -> None:
    """Replayed on the stored studies: MoE #24 and dense #16 moved `--enforce-eager` from a
    new best after it had cost the earlier best 79% and 99.6%; each lost again (88.5%,
    99.1%), a restart each. With the trials before it, that change is now known harmful, and
    from the same incumbent it comes after every other planned move."""
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{REPO / 'benchmarks' / db}")
    t = study.trials[number]
    lever, incumbent = t.system_attrs[samplers.MOVE_ATTR]
    before = [
        u for u in study.trials[:number] if u.state == TrialState.COMPLETE and u.values is not None
    ]
    harmful = _harmful_changes(before, _failed_numbers(before), list(study.directions))
    assert change in harmful
    best = study.trials[incumbent]
    assert (lever, best.params[lever], t.params[lever]) == change
    for seed in range(5):
        moves = [
            (lv, p[lv])
            for lv, p in _lever_moves(best, np.random.default_rng(seed), {}, {}, harmful)
            if lv is not None
        ]
        position = moves.index((lever, t.params[lever]))
        deferred = sum(1 for lv, v in moves if (lv, best.params[lv], v) in harmful)
        assert position >= len(moves) - deferred, (seed, position, len(moves))
    # And it cost again what it had cost: the evidence held.
    assert t.values[0] < (1 - HARMFUL) * best.values[0]


def test_asynchronous_scheduling_off_is_not_deferred_at_30_percent() -> None:
    """MoE #18 switched asynchronous scheduling off from #17 after it had cost #0 30%: under
    the threshold, so it stays among the first moves (it cost 32% again)."""
    study = optuna.load_study(
        study_name="vllm-h100-moe",
        storage=f"sqlite:///{REPO / 'benchmarks' / 'h100' / 'vllm-h100-moe.db'}",
    )
    before = [u for u in study.trials[:18] if u.state == TrialState.COMPLETE]
    harmful = _harmful_changes(before, _failed_numbers(before), list(study.directions))
    assert ("async_scheduling", "default", "off") not in harmful
    assert ("enforce_eager", False, True) in harmful


def _eager_objective(trial: optuna.Trial) -> float:
    """Six two-way levers worth a few percent each, and eager, which costs 80% anywhere."""
    value = 1000.0
    for i in range(6):
        if trial.suggest_categorical(f"lever{i}", ["a", "b"]) == "b":
            value *= 1.0 + 0.03 * (i + 1)
    if trial.suggest_categorical("eager", [False, True]):
        value *= 0.2
    return value


def test_the_sampler_moves_to_eager_once_not_from_every_new_best() -> None:
    """With every new best the planned moves start again; eager, known to cost 80% after its
    first move, waits behind the other levers' moves instead of costing a trial each time."""
    eager_moves = []
    for seed in range(4):
        study = optuna.create_study(
            direction="maximize", sampler=samplers.make_sampler("tpe", seed=seed)
        )
        study.enqueue_trial({**{f"lever{i}": "a" for i in range(6)}, "eager": False})
        study.optimize(_eager_objective, n_trials=40)
        moves = [t.system_attrs.get(samplers.MOVE_ATTR) for t in study.trials]
        eager_moves.append(sum(1 for m in moves if m and m[0] == "eager"))
    assert max(eager_moves) <= 1, eager_moves
