"""How borrowed runs read against an explanation's own (:mod:`autotune.explain.occasions`):
the drift between occasions, per lending study, from configurations holding both."""

from __future__ import annotations

import math

import pytest

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
