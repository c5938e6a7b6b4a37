"""The minimal search's drop-together attempt (:mod:`autotune.explain.elimination`), driven
by the replay of the explain loop (known truths, seeded noise, no servers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from explain_replay import Config, explain, planner_for, replay
from explain_spaces import bool_levers

from autotune.explain import ExplainSettings
from autotune.space import SearchSpace

PASSENGERS = ["p1", "p2", "p3", "p4"]
NAMES = ["fast", *PASSENGERS]
WINNER = {n: True for n in NAMES}
SEEDS = range(8)


def fast_only(c: Config) -> float:
    """fast doubles the throughput; the four passengers do nothing."""
    return 100.0 * (2.0 if c["fast"] else 1.0)


@pytest.fixture()
def space(tmp_path: Path) -> SearchSpace:
    return bool_levers(tmp_path, NAMES)


def _settings(together: bool) -> ExplainSettings:
    return ExplainSettings(repeats=2, max_repeats=4, path=False, drop_together=together)


def test_passengers_are_dropped_together_in_one_step(space: SearchSpace) -> None:
    attempts = 0
    for seed in SEEDS:
        planner = planner_for(space, WINNER, _settings(True))
        result = replay(planner, fast_only, seed=seed, noise=0.01)
        state = result.state
        assert state.together is not None and set(state.together) <= set(PASSENGERS)
        if len(state.together) < 2:
            # the winner measured high by chance makes every passenger look like a loss
            assert state.together_dropped is None
            continue
        attempts += 1
        assert state.together_dropped is True
        group = [d for d in state.decisions if d.why.startswith("together (")]
        assert [d.change for d in group] == state.together
        assert all(d.action == "dropped" for d in group)
        assert len({d.key for d in group}) == 1  # one candidate measured for all of them
        e = explain(planner, result)
        assert e.minimal is not None and e.minimal.complete and e.minimal.kept == ["fast"]
        assert any(m.startswith("trying first to drop together") for m in result.decided)
        assert any(m.startswith("dropped together: ") for m in result.decided)
    assert attempts >= 6


def test_together_takes_fewer_restarts_for_the_same_minimal_winner(space: SearchSpace) -> None:
    costs = {}
    for together in (True, False):
        total, kept = 0, []
        for seed in SEEDS:
            planner = planner_for(space, WINNER, _settings(together))
            result = replay(planner, fast_only, seed=seed, noise=0.02)
            total += sum(1 for m in result.measured if m.phase == "minimal")
            minimal = explain(planner, result).minimal
            assert minimal is not None
            kept.append(minimal.kept)
        costs[together] = total
        assert all("fast" in k for k in kept)
    assert costs[True] < 0.8 * costs[False], costs


def test_a_group_that_costs_too_much_together_falls_back_to_one_at_a_time(
    tmp_path: Path,
) -> None:
    # five changes worth 2% each: at 2% noise the ablation cannot tell one from nothing, but
    # three or more together cost 6-10%, beyond the 3% tolerance: the attempt must fail, and
    # the elimination go one change at a time
    names = ["a", "b", "c", "d", "e"]
    space = bool_levers(tmp_path, names)

    def truth(c: Config) -> float:
        return 100.0 * 1.02 ** sum(1 for n in names if c[n])

    tried = 0
    for seed in range(SEEDS.start, SEEDS.stop + 8):
        planner = planner_for(space, {n: True for n in names}, _settings(True))
        result = replay(planner, truth, seed=seed, noise=0.02)
        state = result.state
        if state.together is None or len(state.together) < 3:
            continue
        tried += 1
        assert state.together_dropped is False
        assert not any(d.why.startswith("together (") for d in state.decisions)
        assert {d.change for d in state.decisions} == set(names)  # each decided alone
        assert any(m.startswith("not dropped together") for m in result.decided)
        minimal = explain(planner, result).minimal
        assert minimal is not None and minimal.complete
    assert tried >= 5


def test_resuming_inside_the_attempt_measures_what_an_uninterrupted_run_does(
    space: SearchSpace,
) -> None:
    settings = _settings(True)
    whole = replay(planner_for(space, WINNER, settings), fast_only, seed=3, noise=0.02)
    ablation = sum(1 for m in whole.measured if m.phase == "ablation")
    total = len(whole.measured)
    assert total > ablation + 1
    for k in (ablation, ablation + 1, total - 1):
        first = replay(planner_for(space, WINNER, settings), fast_only, seed=3, noise=0.02,
                       budget=k)  # fmt: skip
        planner = planner_for(space, WINNER, settings)
        rest = replay(planner, fast_only, seed=3, noise=0.02, runs=first.runs, state=first.state)
        assert [m.key for m in first.measured + rest.measured] == [m.key for m in whole.measured]
        assert rest.state == whole.state


def test_one_at_a_time_makes_no_attempt(space: SearchSpace) -> None:
    planner = planner_for(space, WINNER, _settings(False))
    result = replay(planner, fast_only, seed=1, noise=0.01)
    assert result.state.together is None and result.state.together_dropped is None
    assert not any(d.why.startswith("together (") for d in result.state.decisions)
