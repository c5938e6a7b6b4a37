"""``autotune explain`` beside each configuration's throughput: its J/token and GPU power,
averaged over the runs that measured their GPUs; nothing of the kind without telemetry."""

from __future__ import annotations

import pytest

from autotune.cli import _common
from autotune.cli._explain import print_explanation
from autotune.explain import Effect, Explanation, Interval, Measured
from autotune.explain.record import ExplainRun
from autotune.telemetry import Telemetry


def _measured(key: str, mean: float) -> Measured:
    return Measured(key=key, n=2, values=[mean - 1, mean + 1], mean=Interval(value=mean))


def _explanation() -> Explanation:
    return Explanation(
        winner=7,
        unit="tok/s",
        objective="output throughput",
        tolerance=0.03,
        winner_config={"moe": "cutlass"},
        baseline_config={"moe": "marlin"},
        winner_measured=_measured("k-win", 1000.0),
        baseline_measured=_measured("k-base", 400.0),
        effects=[
            Effect(
                change="moe",
                levers=["moe"],
                winner={"moe": "cutlass"},
                baseline={"moe": "marlin"},
                reverted=["moe"],
                without=_measured("k-moe", 600.0),
                contribution=Interval(value=400.0),
                relative=0.4,
            )
        ],
        complete=True,
    )


def _run(key: str, index: int, per_token: float | None, power: float) -> ExplainRun:
    telemetry = Telemetry(
        source="nvml", power_mean_w=power, energy_j=1.0, energy_per_token_j=per_token
    )
    return ExplainRun(key=key, index=index, values=[1.0], telemetry=telemetry)


def _printed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, runs: dict
) -> str:
    monkeypatch.setattr(_common.console, "width", 300)
    print_explanation(_explanation(), runs=runs)
    return " ".join(capsys.readouterr().out.split())


def test_each_configuration_shows_its_joules_per_token_and_power(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {
        "k-win": [_run("k-win", 0, 0.30, 800.0), _run("k-win", 1, 0.34, 820.0)],
        "k-base": [_run("k-base", 0, 0.9, 600.0)],
        "k-moe": [_run("k-moe", 0, 0.5, 700.0), _run("k-moe", 1, None, 710.0)],
    }
    text = _printed(capsys, monkeypatch, runs)
    assert "GPU: winner 0.32 J/token, 810 W, baseline 0.9 J/token, 600 W" in text
    assert "without it: J/token, GPU power" in text
    assert "│ +400.0 │ +40.0% │ 0.5 J/token, 705 W │" in text  # the run without energy: power


def test_without_telemetry_the_tables_are_as_they_were(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    none = ExplainRun(key="k-win", index=0, values=[1.0], telemetry=Telemetry.none("no NVML"))
    for runs in ({}, {"k-win": [none]}):
        text = _printed(capsys, monkeypatch, runs)
        assert "J/token" not in text and "GPU" not in text
        assert "│ +400.0 │ +40.0% │" in text
