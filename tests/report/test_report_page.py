"""The HTML report page: sections for every study size, escaping, secrets, the noise and time
sections, and a real headless-browser render."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest_results import (
    BASELINE_PARAMS,
    TrialSpec,
    frozen_trial,
    make_study,
    record,
    typical_specs,
)
from report_page import CHROMIUM, PLACEHOLDERS, PLANTED, PLOTS, chromium_dom, parse

from autotune.report import write_report
from autotune.results import load_remeasurements, remeasure_key
from autotune.trial.record import RemeasureRecord

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

_BIG: dict[bool, Path] = {}


@pytest.fixture(scope="module")
def big_study(tmp_path_factory: pytest.TempPathFactory) -> Callable[[bool], optuna.Study]:
    """200-trial studies (one trial carries planted markup), built once: SQLite adds are slow."""

    def get(multi: bool) -> optuna.Study:
        if multi not in _BIG:
            specs = typical_specs(200)
            specs[1].config_extra = {"evil": PLANTED}
            specs[1].failure = None
            specs[1].slo_violation = -1.0
            specs[1].throughput = 5000.0
            base = tmp_path_factory.mktemp(f"big-{multi}")
            make_study(base, specs, multi=multi)
            _BIG[multi] = base / "study.db"
        return optuna.load_study(study_name="autotune-test", storage=f"sqlite:///{_BIG[multi]}")

    return get


SMALL = ["summary", "pareto", "history", "time", "top"]


@pytest.mark.parametrize(
    ("n", "multi", "sections", "plots"),
    [
        (0, False, ["summary"], []),
        (0, True, ["summary"], []),
        (1, False, SMALL, ["plot-pareto", "plot-history", "plot-time"]),
        (2, True, SMALL, ["plot-pareto", "plot-history", "plot-time"]),
        # 200 single-objective trials cost 5 s more to store, same code
        (200, True, [*SMALL[:3], "importance", "time", "failures", "top"], PLOTS),
    ],
)
def test_sections_for_study_sizes(
    tmp_path: Path,
    big_study: Callable[[bool], optuna.Study],
    n: int,
    multi: bool,
    sections: list[str],
    plots: list[str],
) -> None:
    """Each section is shown only when the study has what it needs: no empty placeholder
    (no curve, no explanation, no re-measurement, no fleet plan here)."""
    if n == 200:
        study = big_study(multi)
    else:
        study = make_study(tmp_path, typical_specs(n) if n else [], multi=multi)
    path = write_report(study, path=tmp_path / "r" / "report.html")
    page = parse(path)
    assert list(page.sections) == sections
    assert [p for p in PLOTS if p in page.ids] == plots
    raw = path.read_text(encoding="utf-8")
    assert [p for p in PLACEHOLDERS if p in raw] == []
    assert f"trials{n}" in page.sections["summary"].replace(" ", "")
    # Self-contained: one inline plotly.js plus one inline script per plot, no external URLs.
    assert page.tags.get("script") == 1 + len(plots)
    assert not [u for u in page.urls if re.match(r"(https?:)?//", u)]
    assert page.tags.get("link", 0) == 0
    if n == 0:
        assert "No feasible trial" in page.sections["summary"]
    if n == 200:
        assert "Tuner overhead" in page.sections["time"]
        assert "cuda_oom" in page.sections["failures"]
        # Importances say what they are, and how to measure what a lever is worth.
        importance = " ".join(page.sections["importance"].split())
        assert "where the trials varied" in importance
        assert "not what a lever is worth at the winner" in importance
        assert "`autotune explain --study autotune-test`" in importance


def test_only_infeasible_trials(tmp_path: Path) -> None:
    specs = [
        TrialSpec(failure="cuda_oom", is_baseline=True),
        TrialSpec(failure="nccl_error"),
        TrialSpec(throughput=500.0, slo_violation=20.0),
        TrialSpec(throughput=700.0, slo_violation=5.0),
    ]
    page = parse(write_report(make_study(tmp_path, specs, multi=True), path=tmp_path / "r.html"))
    # No feasible trial: no top table, no importances (the summary says so once).
    assert list(page.sections) == ["summary", "pareto", "history", "time", "failures"]
    assert "feasible0" in page.sections["summary"].replace(" ", "")
    assert "No feasible trial" in page.sections["summary"]
    assert "plot-pareto" in page.ids  # the SLO violators were measured and are plotted
    assert "plot-importance" not in page.ids
    failures = page.sections["failures"]
    assert "cuda_oom" in failures and "nccl_error" in failures
    assert "constraint violated (measured)" in failures


def test_summary_baseline_best_and_time_breakdown(tmp_path: Path) -> None:
    phases = {"restart": 10.0, "warmup": 2.0, "measure": 6.0, "tuner": 2.0}
    specs = [
        TrialSpec(throughput=25.0, tpot_p99_ms=510.0, is_baseline=True, phase_seconds=phases),
        TrialSpec(throughput=1000.0, tpot_p99_ms=20.0, phase_seconds=phases),
    ]
    page = parse(write_report(make_study(tmp_path, specs), path=tmp_path / "r.html"))
    summary = page.sections["summary"]
    assert "baseline" in summary and "best" in summary
    assert "40.00x" in summary
    assert "COMPLETE: 2" in summary
    time = page.sections["time"]
    assert "Tuner overhead: 10.0 %" in time
    assert "restart10.0" in time.replace(" ", "")  # mean seconds per trial
    top = page.sections["top"]
    assert top.index("1,000.0") < top.index("25.0")  # ranked by throughput


def _start(
    *marks: tuple[str, float], ready_s: float | None = None, failed_s: float | None = None
) -> dict[str, Any]:
    stages = [{"stage": stage, "at_s": at} for stage, at in marks]
    return {"stages": stages, "ready_s": ready_s, "failed_s": failed_s}


def test_the_restarts_time_by_start_up_stage(tmp_path: Path) -> None:
    """The stages each start went through, summed up by stage: the median and the trial
    that spent the longest in it (an fp8 configuration's compile, here), and start to
    healthy; a failed start's stages count, its start to healthy does not."""
    phases = {"restart": 60.0, "warmup": 2.0, "measure": 6.0, "tuner": 0.5}
    fast = _start(("loading the model", 20.0), ("compiling", 25.0), ready_s=50.0)
    slow = _start(("loading the model", 21.0), ("compiling", 26.0), ready_s=110.0)
    oom = _start(("loading the model", 19.0), ("compiling", 24.0), failed_s=40.0)
    specs = [
        TrialSpec(is_baseline=True, phase_seconds=phases, attrs={"startup": {"server": fast}}),
        TrialSpec(throughput=150.0, phase_seconds=phases, attrs={"startup": {"server": slow}}),
        TrialSpec(failure="cuda_oom", phase_seconds=phases, attrs={"startup": {"server": oom}}),
    ]
    page = parse(write_report(make_study(tmp_path, specs), path=tmp_path / "r.html"))
    assert "Start-up, by stage" in page.sections["time"]
    time = page.sections["time"].replace(" ", "")  # the table's cells, run together
    # service | stage | starts | median | longest (start)
    assert "servercompiling325.084.0(#1)" in time  # 25, 84 and 16 s
    assert "serverstartingtheprocess320.021.0(#1)" in time
    assert "serverloadingthemodel35.05.0(#2)" in time
    assert "serverstarttohealthy280.0110.0(#1)" in time


def test_re_measurements_starts_count_in_the_start_up_table(tmp_path: Path) -> None:
    """A re-measurement restarts its services: its stages are stored with it and counted,
    named by the trial it re-measured."""
    phases = {"restart": 60.0, "warmup": 2.0, "measure": 6.0, "tuner": 0.5}
    fast = _start(("loading the model", 20.0), ("compiling", 25.0), ready_s=50.0)
    slow = _start(("loading the model", 21.0), ("compiling", 26.0), ready_s=110.0)
    specs = [
        TrialSpec(is_baseline=True, phase_seconds=phases, attrs={"startup": {"server": fast}}),
        TrialSpec(throughput=150.0, phase_seconds=phases, attrs={"startup": {"server": slow}}),
    ]
    study = make_study(tmp_path, specs)
    # a duplicate stored before reused trials dropped the stages they copied: not a start
    copy = dict(study.trials[1].user_attrs, reused_from=1)
    study.add_trial(
        optuna.trial.create_trial(
            params=study.trials[1].params,
            distributions=study.trials[1].distributions,
            value=150.0,
            user_attrs=copy,
        )
    )
    again = _start(("loading the model", 22.0), ("compiling", 27.0), ready_s=130.0)
    stored = RemeasureRecord(
        of=1, repeat=1, values=[140.0], feasible=True, startup={"server": again}
    ).to_attrs()
    assert stored["startup"]["server"]["ready_s"] == 130.0
    study.set_user_attr(remeasure_key(1, 1), stored)
    assert load_remeasurements(study)[0].startup["server"].ready_s == 130.0
    time = parse(write_report(study, path=tmp_path / "r.html")).sections["time"]
    cells = time.replace(" ", "")
    assert "servercompiling384.0103.0(#1,re-measure1)" in cells  # 25, 84 and 103 s
    assert "serverstarttohealthy3110.0130.0(#1,re-measure1)" in cells


def test_no_start_up_table_without_stage_lines(tmp_path: Path) -> None:
    phases = {"restart": 10.0, "warmup": 2.0, "measure": 6.0, "tuner": 2.0}
    plain = {"startup": {"server": _start(ready_s=9.0)}}  # an engine printing no stage line
    specs = [TrialSpec(is_baseline=True, phase_seconds=phases, attrs=plain)]
    page = parse(write_report(make_study(tmp_path, specs), path=tmp_path / "r.html"))
    assert "Start-up, by stage" not in page.sections["time"]


def test_values_are_escaped(tmp_path: Path) -> None:
    rec = record(["/usr/bin/true", "--name", PLANTED], {"EVIL": PLANTED}, [])
    specs = [
        TrialSpec(config_extra={"evil": PLANTED}, services={"worker": rec}, throughput=900.0),
        TrialSpec(failure="unknown", throughput=0.0),
    ]
    study = make_study(tmp_path, specs, multi=True)
    study.add_trial(study.trials[1])  # a second failed trial: the failure table has rows
    path = write_report(study, path=tmp_path / "r.html")
    raw = path.read_text(encoding="utf-8")
    assert '<script>alert("pwned")' not in raw
    assert '<i id="pwned">' not in raw
    page = parse(path)
    assert "pwned" not in page.ids
    assert page.tags.get("i", 0) == 0
    assert f"evil = {PLANTED}" in page.sections["top"]  # shown literally, as text
    assert "EVIL=" in page.sections["top"] and "alert" in page.sections["top"]


def test_secrets_of_a_study_written_before_redaction_are_not_reported(tmp_path: Path) -> None:
    """A study holding real credentials (older autotune, other tooling): the report, meant to
    be shared, redacts them on the way in."""
    token, key = "hf_CANARYreport77", "sk-CANARYreport88"
    rec = record(["/usr/bin/true", "--api-key", key, "--port", "1"], {"HF_TOKEN": token}, [])
    study = make_study(tmp_path, [TrialSpec(services={"worker": rec}, throughput=900.0)])
    failed = frozen_trial(TrialSpec(failure="exited", services={"worker": rec}), multi=False)
    failed.user_attrs["reason"] = f"worker: rejected --api-key={key}"
    study.add_trial(failed)
    stored = str([t.user_attrs for t in study.trials])
    assert token in stored and key in stored  # control: the study really holds them
    raw = write_report(study, path=tmp_path / "r.html").read_text(encoding="utf-8")
    assert "CANARY" not in raw
    page = parse(tmp_path / "r.html")
    assert "'HF_TOKEN=<redacted>' /usr/bin/true --api-key '<redacted>'" in page.sections["top"]
    assert "--api-key=<redacted>" in page.sections["failures"]


def test_importances_with_enough_trials(tmp_path: Path) -> None:
    page = parse(write_report(make_study(tmp_path, typical_specs(40)), path=tmp_path / "r.html"))
    assert "plot-importance" in page.ids
    raw = (tmp_path / "r.html").read_text()
    block = raw[raw.index('id="plot-importance"') :]
    assert "moe_runner_backend" in block[: block.index("</script>")]


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium not installed (Debian: apt-get install -y chromium); "
    "the headless-browser check of the report is skipped",
)
def test_report_renders_in_headless_chromium(
    tmp_path: Path,
    big_study: Callable[[bool], optuna.Study],
) -> None:
    study = big_study(True)
    path = write_report(study, path=tmp_path / "report.html")
    dom = chromium_dom(path, tmp_path / "profile")
    starts = sorted((dom.index(f'id="{p}"'), p) for p in PLOTS)
    for i, (start, plot_id) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(dom)
        block = dom[start:end]
        # Plotly.newPlot ran: the div became a plot with SVG layers and drawn marks.
        assert "js-plotly-plot" in block[:300], plot_id
        assert 'class="main-svg"' in block, plot_id
        assert re.search(r'class="(point|bars?|trace [a-z]+)', block), plot_id
    assert '<i id="pwned"' not in dom  # the planted markup stayed text
    assert "&lt;script&gt;alert" in dom


def test_noise_section_and_time_breakdown_with_probe_aborts_and_re_measurements(
    tmp_path: Path,
) -> None:

    from autotune.results import remeasure_key

    def spec(thr: float, mem: float, measure: float) -> TrialSpec:
        phases = {"restart": 1.0, "probe": 0.2, "warmup": 1.0, "measure": measure, "tuner": 0.05}
        params = {**BASELINE_PARAMS, "mem_fraction_static": mem}
        return TrialSpec(throughput=thr, params=params, phase_seconds=phases)

    study = make_study(tmp_path, [spec(900.0, 0.70, 2.0), spec(950.0, 0.71, 2.0)])
    aborted = frozen_trial(spec(300.0, 0.72, 0.5), multi=False)
    aborted.user_attrs["aborted"] = "upper 95% bound 330 < 0.9 x incumbent #1"
    study.add_trial(aborted)
    for of, repeat, value in ((0, 1, 910.0), (1, 1, 940.0)):
        study.set_user_attr(
            remeasure_key(of, repeat),
            {
                "of": of,
                "repeat": repeat,
                "feasible": True,
                "metrics": {"output_throughput": value},
                "phase_seconds": {"restart": 1.5, "probe": 0.2, "warmup": 1.0, "measure": 2.0},
            },
        )
    page = parse(write_report(study, path=tmp_path / "r.html"))
    assert list(page.sections) == ["summary", "pareto", "history", "noise", "time", "top"]
    noise = " ".join(page.sections["noise"].split())
    assert "Run-to-run noise" in noise and "1 degrees of freedom" not in noise
    assert "945.0" in noise and "± " in noise  # mean of trial 1 and its re-run
    assert "1 (winner)" in noise and "re-run 1: 940.0" in noise
    summary = page.sections["summary"]
    assert "aborted early1" in summary and "945.0 +- " in summary and "n=2" in summary
    time = " ".join(page.sections["time"].split())
    assert "correctness probe" in time and "median s / trial" in time
    assert "1 trial(s) aborted early" in time and "0.50 s against 2.00 s" in time
    assert "Re-measurement: 2 run(s), 9.4 s" in time
    assert "300.0" not in page.sections["top"]  # a partial estimate is not ranked
