"""The report's explanation section (what `autotune explain` stored): effects, waterfall,
disagreements with the importances, escaping."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest
from conftest_results import BASELINE_PARAMS, TrialSpec, make_study, typical_specs
from report_explanations import MOE, OOM, an_explanation, explained, iv
from report_page import PLANTED, figure, parse, section_html, section_text

from autotune.explain import Measured
from autotune.explain.record import RESULT_ATTR
from autotune.report import param_importances, waterfall_bars, waterfall_figure, write_report
from autotune.results import best_estimate

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

# --- the explanation section (what `autotune explain` stored) ------------------------------


def test_the_explanation_section(tmp_path: Path) -> None:
    study = make_study(tmp_path, typical_specs(20))
    expl = explained(study)
    path = write_report(study, path=tmp_path / "r.html")
    raw, page = path.read_text(encoding="utf-8"), parse(path)
    # The explanation leads, right after the summary.
    assert list(page.sections) == [
        "summary",
        "explanation",
        "pareto",
        "history",
        "importance",
        "time",
        "failures",
        "top",
    ]
    assert "plot-explain" in page.ids and "plot-importance" in page.ids
    text = section_text(raw, "explanation")
    winner = expl.winner
    assert f"Trial #{winner} : 1,000.0 ± 30.0 tok/s (n=3) against the baseline's 400.0" in text
    assert "a gain of +600.0 tok/s" in text and "incomplete" not in text

    # The waterfall: the baseline, one bar per path step, the winner; the steps add up.
    data, layout = figure(raw, "plot-explain")
    fall = data[0]
    assert fall["type"] == "waterfall" and fall["orientation"] == "h"
    assert fall["y"] == [
        "baseline",
        "cuda_graph",
        MOE,
        "mem_fraction_static",
        "nccl_proto",
        f"winner (trial #{winner})",
    ]
    assert fall["measure"] == ["absolute"] + ["relative"] * 4 + ["total"]
    assert fall["x"] == [400.0, -20.0, 380.0, 220.0, 20.0, 1000.0]
    assert fall["x"][0] + sum(fall["x"][1:-1]) == pytest.approx(fall["x"][-1])
    assert "moe_runner_backend: marlin -&gt; cutlass" in fall["hovertext"][2]
    assert "step +380.0 [+340.0, +420.0] tok/s" in fall["hovertext"][2]
    whiskers = data[1]  # each interval at its bar's end: the step's, centred on the new total
    assert whiskers["x"] == [400.0, 380.0, 760.0, 980.0, 1000.0, 1000.0]
    assert whiskers["error_x"]["array"] == pytest.approx([20.0, 27.0, 40.0, 40.0, 40.0, 30.0])
    assert layout["xaxis"]["title"]["text"] == "output throughput (tok/s)"
    assert layout["yaxis"]["autorange"] == "reversed"  # the baseline on top

    # The minimal winner beside the full one, what was dropped, each decision.
    assert "full winner (trial #" in text and "all 4" in text
    assert "minimal winner 3 of 4: cuda_graph moe_runner_backend mem_fraction_static 985.0" in text
    assert "985.0 ± 29.0 tok/s (n=3) 0.985x [0.950, 1.020]" in text
    assert "Dropped (1): nccl_proto" in text
    assert "1 dropped nccl_proto without it 985.0" in text
    assert f"4 kept cuda_graph the winner without it fails ({OOM})" in text
    assert "autotune best --study autotune-test --minimal" in text

    assert "answer another question: where the trials varied" in text

    # Importances beside each lever's measured contribution: one table row per lever (by
    # importance), two bar series.
    importances = param_importances(study)
    assert importances, "the study must have importances for this test"
    levers = sorted(importances, key=lambda k: (-importances[k], k))
    assert set(levers) == {"cuda_graph", MOE, "mem_fraction_static", "nccl_proto"} | {
        "max_running_requests"  # the one lever the winner left at the baseline's value
    }
    html_ = section_html(raw, "importance")
    body = html_[html_.index("<tbody>") : html_.index("</tbody>")]
    assert body.count("<tr>") == len(levers) == 5
    data, _ = figure(raw, "plot-importance")
    assert [t["name"] for t in data] == [
        "importance (where the trials varied)",
        "measured contribution at the winner (share of the gain)",
    ]
    assert data[0]["y"] == data[1]["y"] == levers
    assert data[0]["x"] == pytest.approx([importances[n] for n in levers])
    # The gain is 600: moe bought 400, mem_fraction_static 100, nccl_proto 10; cuda_graph is
    # required (no contribution to draw); max_running_requests was not changed.
    share = {MOE: 400 / 600, "mem_fraction_static": 100 / 600, "nccl_proto": 10 / 600}
    assert [data[1]["x"][levers.index(n)] for n in share] == pytest.approx(list(share.values()))
    assert data[1]["x"][levers.index("cuda_graph")] is None
    assert data[1]["x"][levers.index("max_running_requests")] is None
    text = section_text(raw, "importance")
    rows = {
        lever: " ".join(re.sub(r"<[^>]+>", " ", unescape(row)).split())
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
        for lever in levers
        if f"<td>{lever}</td>" in row
    }
    assert (
        "cuda_graph" in rows and "required: without it the deployment fails" in rows["cuda_graph"]
    )
    assert "failed: " + OOM in rows["cuda_graph"]
    assert "marlin -> cutlass" in rows[MOE] and "+400.0 [+360.0, +440.0]" in rows[MOE]
    assert "66.7 % [60.0, 73.3] kept" in rows[MOE]
    assert "1.7 % [-8.3, 11.7] dropped" in rows["nccl_proto"]
    assert "reverted together with mem_fraction_static" in rows["nccl_proto"]
    assert "not changed by the winner" in rows["max_running_requests"]
    assert f"from the explanation of trial #{winner}" in text
    assert "not what a lever is worth at the winner" in text
    assert "freshly started processes" in text


def test_an_importance_the_explanation_contradicts_is_explained_in_words(tmp_path: Path) -> None:
    """The bundled study's case: mem_fraction_static first by importance (the trials varied
    with it), while the explanation measures that reverting it at the winner costs nothing
    and drops it from the minimal winner. The report says both, and why both hold."""
    specs = [TrialSpec(throughput=400.0, is_baseline=True)]
    for i in range(12):  # only mem_fraction_static moves the objective across the trials
        params = {**BASELINE_PARAMS, "mem_fraction_static": round(0.70 + 0.02 * i, 2)}
        params["nccl_proto"] = ["unset", "LL"][i % 2]
        specs.append(TrialSpec(throughput=200.0 + 60.0 * i, params=params))
    study = make_study(tmp_path, specs)
    estimate = best_estimate(study)
    assert estimate is not None
    expl = an_explanation(estimate.trial.number)
    effects = list(expl.effects)
    effects[2] = effects[2].model_copy(update={"contribution": iv(2.0, -30.0, 34.0)})
    assert expl.minimal is not None
    minimal = expl.minimal.model_copy(
        update={"dropped": ["nccl_proto", "mem_fraction_static"], "kept": ["cuda_graph", MOE]}
    )
    expl = expl.model_copy(update={"effects": effects, "minimal": minimal})
    study.set_user_attr(RESULT_ATTR, expl.model_dump(mode="json"))
    importances = param_importances(study)
    assert max(importances, key=lambda k: importances[k]) == "mem_fraction_static"
    raw = write_report(study, path=tmp_path / "r.html").read_text(encoding="utf-8")
    text = section_text(raw, "importance")
    assert (
        "mem_fraction_static ranks #1 by importance" in text
        and "reverting it at the winner costs +2.0 [-30.0, +34.0] tok/s (an interval that holds "
        "0: nothing measurable), and the minimal winner drops it"
        in text
    )
    assert "Both figures hold: the trials varied most with these levers" in text
    assert MOE + " ranks" not in text  # a change that bought something is not named


def test_disagreements_name_only_high_levers_worth_nothing_at_the_winner() -> None:
    from autotune.report.importance import _disagreements

    expl = an_explanation(7)
    importances = {"nccl_proto": 0.5, "max_running_requests": 0.3, MOE: 0.15, "cuda_graph": 0.05}
    levers = list(importances)
    lines = re.findall(r"<li>(.*?)</li>", unescape(_disagreements(levers, importances, expl)))
    assert len(lines) == 2
    assert lines[0].startswith("nccl_proto ranks #1 by importance (50.0 %), yet reverting it")
    assert "and the minimal winner drops it" in lines[0]
    assert lines[1].startswith("max_running_requests ranks #2 by importance (30.0 %), and the ")
    assert "keeps the baseline's value" in lines[1]
    # Nothing to say when the high ones bought something: no list at all.
    assert _disagreements([MOE], {MOE: 0.9}, expl) == ""


def test_an_incomplete_explanation_and_a_new_winner_say_so(tmp_path: Path) -> None:
    study = make_study(tmp_path, typical_specs(3))
    expl = explained(study).model_copy(
        update={
            "winner": 99,
            "complete": False,
            "stopped": "the budget of 20 restarts is spent",
            "path": [],
            "minimal": None,
        }
    )
    study.set_user_attr(RESULT_ATTR, expl.model_dump(mode="json"))
    raw = write_report(study, path=tmp_path / "r.html").read_text(encoding="utf-8")
    text = section_text(raw, "explanation")
    assert "incomplete (stopped: the budget of 20 restarts is spent)" in text
    assert "`autotune explain --study autotune-test` resumes it" in text
    assert "this explains trial #99" in text
    assert "No minimal winner" in text
    assert '<section id="importance">' not in raw  # 3 trials: too few for importances
    data, _ = figure(raw, "plot-explain")
    assert "interactions and the rest" in data[0]["y"]  # no path: the contributions instead


def test_the_waterfall_without_a_path_adds_the_contributions_and_the_rest() -> None:
    expl = an_explanation(7).model_copy(update={"path": []})
    bars = waterfall_bars(expl)
    assert bars is not None
    assert [b.label for b in bars] == [
        "baseline",
        MOE,
        "mem_fraction_static",
        "nccl_proto",
        "interactions and the rest",
        "winner (trial #7)",
    ]
    # Largest first; the rest closes the gap to the winner: 1000 - 400 - (400 + 100 + 10).
    assert [b.value for b in bars] == [400.0, 400.0, 100.0, 10.0, 90.0, 1000.0]
    assert sum(b.value for b in bars[:-1]) == pytest.approx(bars[-1].value)
    assert "cuda_graph (required: without it the deployment fails)" in bars[4].hover
    fig = waterfall_figure(bars, expl)
    assert list(fig.data[0].measure) == ["absolute"] + ["relative"] * 4 + ["total"]


def test_a_path_step_without_a_measurement_goes_with_the_next() -> None:
    expl = an_explanation(7)
    path = list(expl.path)
    path[1] = path[1].model_copy(update={"measured": Measured(key="p2"), "step": None})
    path[2] = path[2].model_copy(update={"step": None})  # its predecessor has no mean
    bars = waterfall_bars(expl.model_copy(update={"path": path}))
    assert bars is not None
    # Axis labels break long lines.
    assert [b.label for b in bars][1:3] == ["cuda_graph", f"{MOE} +<br>mem_fraction_static"]
    assert [b.value for b in bars] == [400.0, -20.0, 600.0, 20.0, 1000.0]
    assert bars[2].interval is None and "no measurement" in bars[2].hover
    # No baseline measurement: nothing to start from.
    broken = expl.model_copy(update={"baseline_measured": Measured(key="b", failure="exited")})
    assert waterfall_bars(broken) is None


def test_explanation_names_are_escaped(tmp_path: Path) -> None:
    evil = "<b>bold</b>" + PLANTED
    study = make_study(tmp_path, typical_specs(3))
    explained(study, moe=evil)
    path = write_report(study, path=tmp_path / "r.html")
    raw, page = path.read_text(encoding="utf-8"), parse(path)
    html_ = section_html(raw, "explanation")
    assert "<b>bold" not in html_ and '<i id="pwned">' not in raw
    assert '<script>alert("pwned")' not in raw
    assert "pwned" not in page.ids
    text = page.sections["explanation"]
    assert evil in text  # shown literally, as text, in the tables
    data, _ = figure(raw, "plot-explain")
    label = data[0]["y"][2]
    assert label.startswith("&lt;b&gt;bold&lt;/b&gt;&lt;script&gt;") and "<" not in label
    assert "&lt;b&gt;bold" in data[0]["hovertext"][2]
