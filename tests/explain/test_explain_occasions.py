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
from autotune.explain.occasions import describe, occasions, source_study
from autotune.explain.record import ExplainRun


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


def test_a_machine_17_percent_faster_is_told_apart_from_the_noise() -> None:
    """The MoE case: the check study's H100 served 17% more than the explanation's."""
    runs = {
        "w": [_run("w", 1170.0, "chk#1"), _run("w", 1171.0, "chk#1/1"), _run("w", 1000.0),
              _run("w", 1001.0)],
        "b": [_run("b", 585.0, "chk#0"), _run("b", 500.0), _run("b", None)],
    }  # fmt: skip
    [o] = occasions(runs, sd=0.03, df=8)
    assert o.study == "chk" and o.configurations == 2
    assert o.ratio is not None and o.ratio.value == pytest.approx(1.17, abs=0.002)
    assert o.ratio.low is not None and o.ratio.low > 1 and o.drift
    text = describe(o)
    assert text.startswith("runs lent by study 'chk' read +17.0% against this explanation's")
    assert "the occasions differ" in text


def test_runs_that_agree_are_within_the_noise() -> None:
    runs = {
        "w": [_run("w", 1010.0, "chk#1"), _run("w", 1000.0), _run("w", 990.0)],
        "r": [_run("r", 700.0, "own#23"), _run("r", 712.0)],
    }
    got = {o.study: o for o in occasions(runs, sd=0.03, df=8)}
    assert set(got) == {"chk", "own"}
    assert not got["chk"].drift and not got["own"].drift
    assert "within the noise" in describe(got["chk"])
    # one configuration, 1 lent and 2 own runs: half-width t(8) x 3% x sqrt(1/1 + 1/2)
    r = got["chk"].ratio
    assert r is not None and r.high is not None
    expected = math.exp(math.log(1010 / 995) + 2.306 * 0.03 * math.sqrt(1.5))
    assert r.high == pytest.approx(expected, rel=1e-3)


def test_a_study_sharing_no_configuration_is_listed_unmeasured() -> None:
    runs = {"w": [_run("w", 1000.0, "chk#1"), _run("w", 1003.0, "chk#1/1")],
            "r": [_run("r", 800.0)]}  # fmt: skip
    [o] = occasions(runs, sd=0.03, df=8)
    assert o.configurations == 0 and o.ratio is None and not o.drift
    assert "share no configuration" in describe(o)


def test_without_a_noise_figure_there_is_a_ratio_but_no_verdict() -> None:
    runs = {"w": [_run("w", 1200.0, "chk#1"), _run("w", 1000.0)]}
    [o] = occasions(runs, sd=None, df=0)
    assert o.ratio is not None and o.ratio.low is None and not o.drift
    assert describe(o).endswith("(no noise figure yet)")


def test_nothing_borrowed_nothing_listed() -> None:
    assert occasions({"w": [_run("w", 1000.0), _run("w", 990.0)]}, sd=0.03, df=3) == []


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
    compared with this one; its machine served 17% more, which the explanation says."""
    space = bool_levers(tmp_path, ["fast", "noop", "mid"])
    planner = planner_for(space, ALL, ExplainSettings(repeats=2, path=False, minimal=False))
    win = _lent(planner, ALL, [292.5, 292.6], "chk")  # 250 x 1.17
    base = _lent(planner, {}, [117.0, 117.1], "chk")
    runs = {win[0].key: win, base[0].key: base}
    result = replay(planner, _three, seed=1, runs=runs)
    whys = [m.why for m in result.measured]
    assert len(whys) == 7  # three reverts, two runs each, and the anchor
    assert whys[-1] == "the winner, run 3 (beside the lent runs: the occasions compared)"
    e = explain(planner, result)
    [o] = e.occasions
    assert o.study == "chk" and o.configurations == 1 and o.drift
    assert o.ratio is not None and o.ratio.value == pytest.approx(1.17, rel=0.05)


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
