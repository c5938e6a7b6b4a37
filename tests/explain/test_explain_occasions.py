"""How borrowed runs read against an explanation's own (:mod:`autotune.explain.occasions`):
the drift between occasions, per lending study, from configurations holding both."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import explain_replay as replay_module
import pytest
from explain_replay import explain, planner_for, replay
from explain_spaces import bool_levers

from autotune.explain import ExplainSettings
from autotune.explain.occasions import (
    borrowed,
    by_occasion,
    describe,
    occasions,
    source_study,
    within_noise,
)
from autotune.explain.record import ExplainRun, Interval
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
    assert gone.left_out and "the occasions differ, so its runs are left out" in describe(gone)
    # left out when the runs then read apart; the runs since put the interval across 1
    later = gone.model_copy(update={"ratio": Interval(value=1.05, low=0.95, high=1.16)})
    assert describe(later).endswith(
        ": they read apart on the runs there were when that was decided, so its runs are left "
        "out and what they stood for is measured here"
    )


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


# --------------------------------------------------------------------------- machines

GPU_A = "GPU-6afddaf0-0b1c-4d2e-8f30-1a2b3c4d5e6f"
GPU_B = "GPU-f4d83bfd-9a8b-4c7d-a6e5-f0e1d2c3b4a5"


def _measured(planner: Any, result: Any) -> dict[str, list[tuple[str | None, float]]]:
    """Per configuration (by label), the machines and values of its runs."""
    labels = {v.key: planner.label(v) for v in planner.ablation_variants()}
    return {labels[key]: [(r.machine, r.value) for r in rs] for key, rs in result.runs.items()}


def test_runs_on_an_earlier_machine_are_that_machines_occasion() -> None:
    """Own runs on two GPUs: the latest run's GPU is this machine; the other's runs get an
    occasion of their own, compared like a lending study's. Lent runs and runs without GPU
    telemetry keep their source."""

    def own(key: str, value: float, machine: str | None, at: float | None) -> ExplainRun:
        return _run(key, value).model_copy(
            update={"telemetry": replay_module._telemetry(machine), "measured_at": at}
        )

    runs = {
        "w": [own("w", 1000.0, GPU_A, 1.0), own("w", 1010.0, GPU_A, 2.0),
              own("w", 850.0, GPU_B, 5.0), own("w", 860.0, GPU_B, 6.0)],
        "b": [own("b", 500.0, GPU_A, 3.0), _run("b", 505.0, "chk#0"), own("b", 430.0, None, 4.0)],
    }  # fmt: skip
    marked = by_occasion(runs)
    assert [r.source for r in marked["w"]] == [
        "(this explanation on GPU-6afddaf0)#w/0", "(this explanation on GPU-6afddaf0)#w/0",
        None, None,
    ]  # fmt: skip
    assert [r.source for r in marked["b"]] == ["(this explanation on GPU-6afddaf0)#b/0",
                                                "chk#0", None]  # fmt: skip
    assert [borrowed(r) for r in marked["b"]] == [False, True, False]
    got = {o.study: o for o in occasions(marked)}
    earlier = got["(this explanation on GPU-6afddaf0)"]
    # the run without telemetry counts as this machine's: the baseline 500 against 430
    ratio = math.exp((math.log(1005 / 855) + math.log(500 / 430)) / 2)
    assert earlier.ratio is not None and earlier.ratio.value == pytest.approx(ratio)
    assert earlier.configurations == 2 and earlier.drift
    assert describe(earlier).startswith(
        "runs measured here on an earlier machine (GPU-6afddaf0) read +16.9% against this "
        "machine's runs of the same 2 configuration(s)"
    )
    # one machine (or none seen): nothing changes
    assert by_occasion({"w": runs["w"][:2]}) == {"w": runs["w"][:2]}
    plain = {"w": [_run("w", 1000.0), _run("w", 990.0, "chk#1")]}
    assert by_occasion(plain) == plain


@pytest.mark.parametrize("speed", [1.0, 1 / 1.17])
def test_an_explanation_resumed_on_another_gpu_compares_the_machines(
    tmp_path: Path, speed: float
) -> None:
    """Five runs on one H100, the budget spent; resumed on another. Where the second reads
    like the first, the ablation just finishes there (10 runs). Where it serves 17% less
    (the drift issue 28's H100s showed), the first machine's runs are left out and every
    configuration they stood for is measured again on the second, so no contribution is a
    difference between two machines."""
    space = bool_levers(tmp_path, ["fast", "noop", "mid"])
    planner = planner_for(space, ALL, ExplainSettings(repeats=2, path=False, minimal=False))
    planner.prior_noise = (0.03, 10)  # the tuning study's figure (3% over 10 df)
    first = replay(planner, _three, seed=3, budget=5, machine=GPU_A)
    assert len(first.measured) == 5 and not first.state.left_out
    second = replay(planner, _three, seed=3, runs=first.runs, state=first.state,
                    machine=GPU_B, speed=speed)  # fmt: skip
    e = explain(planner, second)
    [o] = e.occasions
    assert o.study == "(this explanation on GPU-6afddaf0)" and e.borrowed == 0
    if speed == 1.0:
        assert len(second.measured) == 5 and not second.state.left_out and not o.drift
        return
    assert second.state.left_out == [o.study] and o.left_out
    assert o.ratio is not None and o.ratio.value == pytest.approx(1.17, rel=0.05)
    # every configuration read on the second GPU alone, 2 runs each
    runs = _measured(planner, second)
    assert all(sum(m == GPU_B for m, _ in rs) == 2 for rs in runs.values())
    for x in e.effects:
        assert x.without.n == 2
    fast = next(x for x in e.effects if x.change == "fast")
    assert fast.contribution is not None
    # the truth on the second machine: 250 / 1.17 - 125 / 1.17
    assert fast.contribution.value == pytest.approx(125 / 1.17, rel=0.1)
