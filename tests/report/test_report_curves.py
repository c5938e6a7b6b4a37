"""The report's latency-throughput curves, the tok/s per user vs per GPU front, GPUs per
deployment, capacity studies, and the curve plots in headless Chromium."""

from __future__ import annotations

import math
import re
from html import unescape
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest_results import BASELINE_PARAMS, TrialSpec, frozen_trial, make_study, typical_specs
from report_explanations import explained
from report_page import CHROMIUM, PLANTED, chromium_dom, figure, parse

from autotune.plan import PlanSettings, store_settings
from autotune.report import deployment_gpus, nondominated, write_report

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

# --- latency-throughput curves and the tok/s per user vs per GPU front ---------------------

NO_CURVE = "No trial recorded a latency-throughput curve"


def curve_point(x: float, out: float, tpot_mean: float, *, ok: bool = True) -> dict[str, Any]:
    """One stored curve point (``Probe.summary``'s keys)."""
    point: dict[str, Any] = {
        f"{name}_{stat}": None
        for name in ("ttft", "tpot", "itl", "e2e")
        for stat in ("mean", "p50", "p99")
    }
    point.update(
        x=x,
        ok=ok,
        violations=[] if ok else ["ttft_p99 412 > 300 ms"],
        output_throughput=out,
        request_throughput=out / 256,
        goodput=out / 256 if ok else 0.0,
        arrival_rate=None,
        error_rate=0.0,
        completed=64,
        ttft_mean=50.0 + 5 * x,
        ttft_p99=100.0 + 20 * x,
        tpot_mean=tpot_mean,
        tpot_p99=tpot_mean * 1.3,
    )
    return point


def sweep(peak: float, tpot0: float, *, broken: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """A concurrency sweep 1..16: throughput saturating towards ``peak``, TPOT growing."""
    return [
        curve_point(x, peak * x / (x + 4), tpot0 * (1 + x / 8), ok=i not in broken)
        for i, x in enumerate((1, 2, 4, 8, 16))
    ]


def curve_trial(
    spec: TrialSpec,
    curve: list[dict[str, Any]],
    *,
    capacity: dict[str, Any] | None = None,
    deployment: str | None = None,
    reused_from: int | None = None,
) -> optuna.trial.FrozenTrial:
    trial = frozen_trial(spec, multi=False)
    trial.user_attrs["curve"] = curve
    if capacity is not None:
        trial.user_attrs["capacity"] = capacity
    if deployment is not None:
        trial.user_attrs["deployment"] = deployment
    if reused_from is not None:
        trial.user_attrs["reused_from"] = reused_from
    return trial


def mem(i: int) -> dict[str, Any]:
    return {**BASELINE_PARAMS, "mem_fraction_static": round(0.80 + 0.01 * i, 2)}


def curves_study(tmp_path: Path, *, deployment: str | None = None) -> optuna.Study:
    """Trial 0 the baseline; 1..7 feasible, each its own config and curve (point 4 broke an
    SLO; 6's config carries planted markup); 8 re-measures 7's config higher; 9 is
    infeasible; 10 is the best but has no curve; 11 crashed; 12 is reused from 8 (same
    config, same curve)."""
    study = make_study(tmp_path, [])
    trials = [
        curve_trial(
            TrialSpec(throughput=300.0, is_baseline=True), sweep(400.0, 30.0), deployment=deployment
        )
    ]
    for i in range(1, 8):
        extra = {"evil": PLANTED} if i == 6 else {}
        spec = TrialSpec(throughput=400.0 + 100 * i, params=mem(i), config_extra=extra)
        trials.append(
            curve_trial(
                spec, sweep(500.0 + 150 * i, 25.0 - 2 * i, broken=(4,)), deployment=deployment
            )
        )
    trials.append(
        curve_trial(
            TrialSpec(throughput=1200.0, params=mem(7)), sweep(1700.0, 9.0), deployment=deployment
        )
    )
    trials.append(
        curve_trial(
            TrialSpec(throughput=2000.0, params=mem(9), slo_violation=5.0),
            sweep(2500.0, 5.0, broken=(0, 1, 2, 3, 4)),
            deployment=deployment,
        )
    )
    trials.append(
        curve_trial(TrialSpec(throughput=5000.0, params=mem(10)), [], deployment=deployment)
    )
    trials.append(frozen_trial(TrialSpec(failure="cuda_oom", params=mem(11)), multi=False))
    trials.append(
        curve_trial(
            TrialSpec(throughput=1200.0, params=mem(7)),
            sweep(1700.0, 9.0),
            deployment=deployment,
            reused_from=8,
        )
    )
    study.add_trials(trials)
    return study


def rounded(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return sorted((round(x, 9), round(y, 9)) for x, y in points)


def brute_force_front(points: list[tuple[float, float]]) -> set[tuple[float, float]]:
    return {p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)}


def test_curves_and_the_per_user_per_gpu_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no launchers/ here: the bundled deployment file is read
    study = curves_study(tmp_path)
    path = write_report(study, path=tmp_path / "r.html")
    page = parse(path)
    raw = path.read_text(encoding="utf-8")
    assert list(page.sections) == [
        "summary",
        "pareto",
        "curves",
        "frontier",
        "history",
        "importance",
        "time",
        "failures",
        "top",
    ]
    assert "plot-curves" in page.ids and "plot-frontier" in page.ids
    assert '<script>alert("pwned")' not in raw and '<i id="pwned">' not in raw

    data, layout = figure(raw, "plot-curves")
    # The best 5 distinct feasible configurations with a curve (8 ranks above its twin 7
    # and the reused 12; 10 has no curve; 9 is infeasible), then the baseline: 2 plots each.
    names = ["trial 8", "trial 6", "trial 5", "trial 4", "trial 3", "trial 0 (baseline)"]
    assert [t["name"] for t in data] == [n for n in names for _ in (1, 2)]
    assert [t["showlegend"] for t in data] == [True, False] * len(names)
    assert [t.get("yaxis", "y") for t in data] == ["y", "y2"] * len(names)
    assert layout["yaxis"]["title"]["text"] == "TTFT p99 (ms)"
    assert layout["yaxis2"]["title"]["text"] == "TPOT p99 (ms)"
    assert layout["xaxis"]["title"]["text"] == "output throughput (tok/s)"
    six, eight = data[2], data[0]
    assert six["marker"]["symbol"] == ["circle"] * 4 + ["circle-open"]  # point 4 broke an SLO
    assert eight["marker"]["symbol"] == ["circle"] * 5
    assert six["x"] == [p["output_throughput"] for p in sweep(1400.0, 13.0)]
    assert data[3]["y"] == [p["tpot_p99"] for p in sweep(1400.0, 13.0)]
    assert (
        "changed vs baseline:" in six["text"][0] and "mem_fraction_static = 0.86" in six["text"][0]
    )
    assert "evil = &lt;script&gt;alert(" in six["text"][0]  # a changed lever, as text
    assert "broke: ttft_p99 412 &gt; 300 ms" in six["text"][4]
    assert "the baseline" in data[-1]["text"][0]

    data, layout = figure(raw, "plot-frontier")
    assert [t["name"] for t in data] == ["curve points (all configurations)", "Pareto front"]
    # Every point of every trial with a curve (0..9), the reused 12 left out: 10 x 5.
    expected = [
        (1000.0 / p["tpot_mean"], p["output_throughput"] / 8)  # 8 GPUs: the bundled file's gpus
        for curve in [sweep(400.0, 30.0)]
        + [sweep(500.0 + 150 * i, 25.0 - 2 * i) for i in range(1, 8)]
        + [sweep(1700.0, 9.0), sweep(2500.0, 5.0)]
        for p in curve
    ]
    points = list(zip(data[0]["x"], data[0]["y"], strict=True))
    assert len(points) == 50
    assert rounded(points) == rounded(expected)
    front = list(zip(data[1]["x"], data[1]["y"], strict=True))
    assert front == sorted(front)  # drawn left to right
    assert rounded(front) == rounded(list(brute_force_front(expected)))
    assert 1 < len(front) < 50
    assert data[0]["marker"]["symbol"].count("circle-open") == 5 + 7  # 9's and 1..7's point 4
    assert "trial 9" in data[1]["text"][-1] and "on 8 GPUs" in data[1]["text"][-1]
    assert "concurrency" not in data[0]["text"][0] and "load 1" in data[0]["text"][0]
    assert layout["yaxis"]["title"]["text"] == "output tok/s per GPU (higher is better)"
    text = " ".join(page.sections["frontier"].split())
    assert "tok/s per user vs tok/s per GPU" in text
    assert "tok/s per user = 1000 / mean TPOT in ms" in text
    assert "sim-dsv4-flash-pd.yaml: 8 from sim-dsv4-flash-pd.yaml" in text


def test_the_gpu_count_comes_from_the_deployment_file_else_per_deployment(tmp_path: Path) -> None:
    study = curves_study(tmp_path / "s", deployment="my-box")
    launchers = tmp_path / "launchers"
    launchers.mkdir()
    raw = write_report(study, path=tmp_path / "a.html", deployment_dirs=[launchers]).read_text()
    data, layout = figure(raw, "plot-frontier")
    assert layout["yaxis"]["title"]["text"] == "output tok/s per deployment (higher is better)"
    assert max(data[0]["y"]) == pytest.approx(2500.0 * 16 / 20)  # trial 9's top, undivided
    text = " ".join(parse(tmp_path / "a.html").sections["frontier"].split())
    assert "tok/s per user vs tok/s per deployment" in text
    assert "GPU count of my-box is unknown" in text

    # A file whose `name:` is my-box (its file name differs) and sets gpus: 4.
    bundled = Path(__file__).resolve().parents[2] / "launchers" / "sim-dsv4-flash-pd.yaml"
    text = bundled.read_text().replace("name: sim-dsv4-flash-pd", "name: my-box")
    (launchers / "box.yaml").write_text(text.replace("gpus: 8", "gpus: 4"))
    raw = write_report(study, path=tmp_path / "b.html", deployment_dirs=[launchers]).read_text()
    data, layout = figure(raw, "plot-frontier")
    assert layout["yaxis"]["title"]["text"] == "output tok/s per GPU (higher is better)"
    assert max(data[0]["y"]) == pytest.approx(2500.0 * 16 / 20 / 4)
    assert "my-box: 4 from box.yaml" in " ".join(
        parse(tmp_path / "b.html").sections["frontier"].split()
    )


def test_deployment_gpus_reads_the_bundled_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    names = ["sim-dsv4-flash-pd", "sim-dsv4-flash-pd-2node.yaml", "vllm-cpu-local", "nope", ""]
    assert deployment_gpus(names) == {
        "sim-dsv4-flash-pd": (8, "sim-dsv4-flash-pd.yaml"),
        "sim-dsv4-flash-pd-2node.yaml": (16, "sim-dsv4-flash-pd-2node.yaml"),
    }  # vllm-cpu-local runs on CPUs: no gpus:, unknown
    assert deployment_gpus([]) == {}


def test_a_study_without_curves_has_no_curve_sections(tmp_path: Path) -> None:
    """A study that never asked for curves shows no curve section, not an empty one."""
    study = make_study(tmp_path, typical_specs(4))
    path = write_report(study, path=tmp_path / "r.html")
    page = parse(path)
    assert "curves" not in page.sections and "frontier" not in page.sections
    assert "plot-curves" not in page.ids and "plot-frontier" not in page.ids
    assert NO_CURVE not in path.read_text(encoding="utf-8")


def test_curves_of_infeasible_trials_only(tmp_path: Path) -> None:
    study = make_study(tmp_path, [])
    study.add_trial(curve_trial(TrialSpec(throughput=500.0, slo_violation=3.0), sweep(600.0, 20.0)))
    page = parse(write_report(study, path=tmp_path / "r.html"))
    assert "curves" not in page.sections  # no feasible configuration's curve to draw
    assert "plot-frontier" in page.ids  # every curve point is on the per-user / per-GPU plot


def test_a_capacity_study_says_req_s_and_marks_the_capacity(tmp_path: Path) -> None:
    capacity = {
        "over": "rate",
        "capacity": 4.0,
        "upper": 5.0,
        "stop_reason": "bracketed within 25%",
        "precision_reached": True,
        "probes": 5,
    }
    probes = [curve_point(x, 250.0 * x, 10.0 + x, ok=x <= 4.0) for x in (1.0, 2.0, 4.0, 5.0, 8.0)]
    study = make_study(tmp_path, [])
    study.set_metric_names(["capacity_req_s"])
    study.add_trials(
        [
            curve_trial(
                TrialSpec(throughput=2.0, is_baseline=True),
                probes[:3],
                capacity={**capacity, "capacity": 2.0, "upper": 4.0},
            ),
            curve_trial(TrialSpec(throughput=4.0, params=mem(1)), probes, capacity=capacity),
        ]
    )
    path = write_report(study, path=tmp_path / "r.html")
    page, raw = parse(path), path.read_text(encoding="utf-8")
    summary, top = page.sections["summary"], page.sections["top"]
    assert "capacity req/s" in summary and "capacity req/s" in top
    assert "4.0 req/s (n=1" in summary
    assert "Capacity vs TPOT p99" in page.sections["pareto"]
    for section in ("summary", "pareto", "history", "top"):
        assert "tok/s" not in page.sections[section], section
    _, history = figure(raw, "plot-history")
    assert history["yaxis"]["title"]["text"] == "capacity (req/s)"
    pareto, layout = figure(raw, "plot-pareto")
    assert layout["xaxis"]["title"]["text"] == "capacity (req/s, higher is better)"
    assert "4.0 req/s" in pareto[0]["text"][-1]
    data, _ = figure(raw, "plot-curves")
    assert [t["name"] for t in data] == ["trial 1"] * 2 + ["trial 0 (baseline)"] * 2
    best = data[0]
    assert best["marker"]["symbol"] == ["circle", "circle", "star", "circle-open", "circle-open"]
    assert (
        "rate 4 req/s" in best["text"][2]
        and "capacity (the highest passing load)" in best["text"][2]
    )
    assert "capacity" not in best["text"][1]
    assert data[2]["marker"]["symbol"] == ["circle", "star", "circle"]


def test_nondominated_keeps_the_points_nothing_beats_on_both_axes() -> None:
    assert nondominated([]) == []
    assert nondominated([(1.0, 1.0)]) == [0]
    points = [
        (1.0, 10.0),  # 0: front (highest y)
        (2.0, 8.0),  # 1: front
        (2.0, 5.0),  # 2: same x as 1, lower y: dominated
        (1.5, 8.0),  # 3: same y as 1, lower x: dominated
        (3.0, 3.0),  # 4: front
        (2.5, 2.0),  # 5: dominated by 4
        (4.0, 1.0),  # 6: front (highest x)
        (3.0, 3.0),  # 7: equal to 4: the first of equal points is kept
        (math.nan, 20.0),  # 8: not finite: never on the front, dominates nothing
        (math.inf, 0.5),  # 9: same
    ]
    assert nondominated(points) == [0, 1, 4, 6]  # by increasing x
    assert nondominated([(5.0, 5.0), (5.0, 5.0), (1.0, 1.0)]) == [0]
    assert nondominated([(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]) == [2]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_curve_plots_render_in_headless_chromium_without_script_errors(tmp_path: Path) -> None:
    """The curve plots and the explanation's draw in a real browser and no script on the
    page throws; a control page with a planted error shows the error catcher works."""
    study = curves_study(tmp_path / "s", deployment="sim-dsv4-flash-pd")
    explained(study, moe="<b>bold</b>" + PLANTED)
    store_settings(study, PlanSettings(target_rate=3.0, per_replica_rate=0.5, gpu_hour_cost=2.0))
    html = write_report(study, path=tmp_path / "report.html").read_text(encoding="utf-8")
    catcher = (
        "<script>function atErr(m){document.documentElement.setAttribute('data-js-error',"
        "String(m));}window.addEventListener('error',function(e){atErr(e.message);});"
        "window.addEventListener('unhandledrejection',function(e){atErr(e.reason);});</script>"
    )
    assert html.count("<head>\n") == 1
    page = html.replace("<head>\n", "<head>\n" + catcher, 1)
    broken = page.replace("</body>", "<script>notAFunction();</script></body>", 1)

    def dom(text: str, name: str) -> str:
        target = tmp_path / name
        target.write_text(text, encoding="utf-8")
        return chromium_dom(target, tmp_path / f"profile-{name}")

    error = re.compile(r'data-js-error="([^"]*)"')
    caught = error.search(dom(broken, "control.html"))
    assert caught is not None and "notAFunction" in caught.group(1)  # the catcher catches
    out = dom(page, "page.html")
    assert error.search(out) is None, error.search(out)
    starts = sorted(out.index(f'id="{p}"') for p in ("plot-curves", "plot-frontier"))
    for start in starts:
        plotted = out[start : out.find('id="plot-', start + 10)]
        assert "js-plotly-plot" in plotted[:300]
        assert 'class="main-svg"' in plotted
        assert plotted.count('class="point"') >= 10  # markers drawn
    curves = out[starts[0] : out.find('id="plot-', starts[0] + 10)]
    assert curves.count('class="xy"') + curves.count('class="x2y2"') >= 2  # both subplots

    # The explanation: 6 waterfall bars (baseline, 4 steps, winner), their whiskers and
    # figures; then a bar per change and estimate.
    def block(plot_id: str) -> str:
        start = out.index(f'id="{plot_id}"')
        end = out.find('id="plot-', start + 10)
        return out[start : end if end > 0 else len(out)]

    for plot_id, points in (("plot-explain", 12), ("plot-importance", 3)):
        drawn = block(plot_id)
        assert "js-plotly-plot" in drawn[:300], plot_id
        assert 'class="main-svg"' in drawn and 'class="trace bars"' in drawn, plot_id
        assert drawn.count('class="point"') >= points, plot_id
    # Importances and contributions: two bar series, the contributions with whiskers.
    assert block("plot-importance").count('class="trace bars"') == 2
    assert 'class="errorbar"' in block("plot-importance")
    # The fleet plan: one marker per planned configuration, the cheapest a star.
    fleet = block("plot-fleet")
    assert "js-plotly-plot" in fleet[:300] and fleet.count('class="point"') >= 3
    planned, layout = figure(html, "plot-fleet")
    cheapest = planned[-1]
    assert cheapest["name"] == "the cheapest that meets the target"
    assert cheapest["marker"]["symbol"] == "star" and len(cheapest["x"]) == 1
    assert layout["annotations"][0]["text"].startswith("cheapest: ")
    assert fleet.count('class="point"') >= len(planned[-2]["x"]) + 1
    waterfall = block("plot-explain")
    assert waterfall.count('class="annotation"') == 6 and waterfall.count('class="ytick"') == 6
    assert '<i id="pwned"' not in out
    # Plotly draws the change's name as it is: text, no markup, no entity left undecoded.
    tick = re.search(r'<g class="ytick"><text[^>]*>([^<]*bold[^<]*)</text>', waterfall)
    assert tick is not None and unescape(tick.group(1)) == "<b>bold</b>" + PLANTED
