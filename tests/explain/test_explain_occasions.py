"""How borrowed runs read against an explanation's own (:mod:`autotune.explain.occasions`):
the drift between occasions, per lending study, from configurations holding both."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from explain_replay import explain, planner_for, replay
from explain_spaces import bool_levers

from autotune.explain import ExplainSettings
from autotune.explain.occasions import describe, occasions, source_study, within_noise
from autotune.explain.record import ExplainRun
from autotune.results import t_quantile


def _run(key: str, value: float | None, source: str | None = None) -> ExplainRun:
    return ExplainRun(
        key=key,
        index=0,
        values=[] if value is None else [value],
        feasible=True,
        failure="crash" if value is None else None,
        source=source,
    )


def test_the_origin_names_its_study() -> None:
    assert source_study("check#3") == "check"
    assert source_study("check#3/2") == "check"
    assert source_study("a#b#7/1") == "a#b"


def test_the_noise_is_taken_within_each_occasion_so_the_drift_does_not_hide_itself() -> None:
    """Two runs lent at 110 and 90, two of the explanation's own at 100 and 100: within each
    occasion the noise is 10% over 2 degrees of freedom (sqrt(0.02 / 2)); pooled across
    occasions a drift would count as noise."""
    runs = {"w": [_run("w", 110.0, "chk#1"), _run("w", 90.0, "chk#1/1"), _run("w", 100.0),
                  _run("w", 100.0)]}  # fmt: skip
    sd, df = within_noise(runs)
    assert df == 2 and sd == pytest.approx(0.1)


def test_a_machine_17_percent_faster_is_told_apart_from_the_noise() -> None:
    """The MoE case: the check study's H100 served 17% more than the explanation's."""
    runs = {
        "w": [_run("w", 1165.0, "chk#1"), _run("w", 1175.0, "chk#1/1"), _run("w", 995.0),
              _run("w", 1005.0)],
        "b": [_run("b", 585.0, "chk#0"), _run("b", 500.0), _run("b", None)],
    }  # fmt: skip
    [o] = occasions(runs)
    assert o.study == "chk" and o.configurations == 2 and not o.left_out
    assert o.ratio is not None and o.ratio.value == pytest.approx(1.17, abs=0.002)
    assert o.ratio.low is not None and o.ratio.low > 1 and o.drift
    text = describe(o)
    assert text.startswith("runs lent by study 'chk' read +17.0% against this explanation's")
    assert "the occasions differ, and the contributions" in text
    gone = occasions(runs, left_out=["chk"])[0]
    assert gone.left_out and "its runs are left out" in describe(gone)


def test_runs_that_agree_are_within_the_noise() -> None:
    runs = {
        "w": [_run("w", 1010.0, "chk#1"), _run("w", 990.0, "chk#1/1"), _run("w", 1000.0),
              _run("w", 985.0)],
        "r": [_run("r", 700.0, "own#23"), _run("r", 712.0)],
    }  # fmt: skip
    got = {o.study: o for o in occasions(runs)}
    assert set(got) == {"chk", "own"}
    assert not got["chk"].drift and not got["own"].drift
    assert "within the noise" in describe(got["chk"])
    # one configuration, 2 lent and 2 own runs: half-width t(df) x sd x sqrt(1/2 + 1/2)
    sd, df = within_noise(runs)
    assert sd is not None and df == 2
    r = got["chk"].ratio
    assert r is not None and r.high is not None
    expected = math.exp(math.log(1000 / 992.5) + t_quantile(0.95, df) * sd * 1.0)
    assert r.high == pytest.approx(expected, rel=1e-6)


def test_a_study_sharing_no_configuration_is_listed_unmeasured() -> None:
    runs = {"w": [_run("w", 1000.0, "chk#1"), _run("w", 1003.0, "chk#1/1")],
            "r": [_run("r", 800.0)]}  # fmt: skip
    [o] = occasions(runs, (0.03, 8))
    assert o.configurations == 0 and o.ratio is None and not o.drift
    assert "share no configuration" in describe(o)


def test_without_a_noise_figure_there_is_a_ratio_but_no_verdict() -> None:
    runs = {"w": [_run("w", 1200.0, "chk#1"), _run("w", 1000.0)]}
    [o] = occasions(runs)
    assert o.ratio is not None and o.ratio.low is None and not o.drift
    assert describe(o).endswith("(no noise figure yet)")
    [o] = occasions(runs, (0.03, 8))  # the prior, the study's own figure
    assert o.ratio is not None and o.ratio.low is not None and o.drift


def test_nothing_borrowed_nothing_listed() -> None:
    assert occasions({"w": [_run("w", 1000.0), _run("w", 990.0)]}) == []


# --------------------------------------------------------------------------- the anchor

ALL: dict[str, object] = {"fast": True, "noop": True, "mid": True}


def _lent(
    planner: Any, config: dict[str, object], values: list[float], study: str
) -> list[ExplainRun]:
    v = planner.changes.variant([n for n in planner.changes.names if config.get(n)])
    return [
        ExplainRun(key=v.key, index=i, config=v.config, values=[x], feasible=True,
                   source=f"{study}#{i}")
        for i, x in enumerate(values)
    ]  # fmt: skip


def _three(c: dict[str, object]) -> float:
    return 100.0 * (2.0 if c["fast"] else 1.0) * (1.25 if c["mid"] else 1.0)


def test_a_study_that_lent_every_run_of_its_configurations_gets_one_anchor_run(
    tmp_path: Path,
) -> None:
    """The check study lent the winner and the baseline, 2 runs each (``repeats``): the
    ablation measures the reverts, then the winner once more, so the check's occasion is
    compared with this one. Its machine served 17% more: the planner leaves its runs out
    (frozen in the state) and measures the winner and the baseline itself, so every
    contribution is read on one occasion."""
    space = bool_levers(tmp_path, ["fast", "noop", "mid"])
    planner = planner_for(space, ALL, ExplainSettings(repeats=2, path=False, minimal=False))
    win = _lent(planner, ALL, [292.5, 292.6], "chk")  # 250 x 1.17
    base = _lent(planner, {}, [117.0, 117.1], "chk")
    runs = {win[0].key: win, base[0].key: base}
    result = replay(planner, _three, seed=1, runs=runs)
    whys = [m.why for m in result.measured]
    assert whys[6] == "the winner, run 3 (beside the lent runs: the occasions compared)"
    # the lent runs left out, round by round: what each configuration lacks of its own
    assert whys[7:] == ["the baseline, run 1", "the winner, run 2", "the baseline, run 2"]
    assert result.state.left_out == ["chk"]
    assert any("its runs are left out" in d for d in result.decided)
    e = explain(planner, result)
    [o] = e.occasions
    assert o.study == "chk" and o.configurations == 2 and o.drift and o.left_out
    assert o.ratio is not None and o.ratio.value == pytest.approx(1.17, rel=0.05)
    assert e.winner_measured.n == 2 and e.baseline_measured.n == 2 and e.borrowed == 0
    assert e.winner_measured.mean is not None
    assert e.winner_measured.mean.value == pytest.approx(250.0, rel=0.06)


def test_no_anchor_where_a_configuration_already_holds_both_kinds(tmp_path: Path) -> None:
    """One lent run of the winner (repeats 2): the ablation measures the second itself."""
    space = bool_levers(tmp_path, ["fast", "noop", "mid"])
    planner = planner_for(space, ALL, ExplainSettings(repeats=2, path=False, minimal=False))
    win = _lent(planner, ALL, [250.0], "chk")
    result = replay(planner, _three, seed=1, runs={win[0].key: win})
    assert len(result.measured) == 9  # winner 1, baseline 2, reverts 6
    assert not any("occasions compared" in m.why for m in result.measured)
    [o] = explain(planner, result).occasions
    assert o.configurations == 1 and not o.drift
