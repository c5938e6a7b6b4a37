"""The HTML report: structure, escaping, degenerate studies, and a real headless-browser render."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable
from html import unescape
from html.parser import HTMLParser
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

from autotune.explain import (
    Effect,
    Explanation,
    Interval,
    Measured,
    Minimal,
    PathStep,
)
from autotune.explain.record import RESULT_ATTR, Decision
from autotune.plan import PlanSettings, store_settings
from autotune.report import (
    deployment_gpus,
    nondominated,
    param_importances,
    waterfall_bars,
    waterfall_figure,
    write_report,
)
from autotune.results import best_estimate

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

SECTIONS = [
    "summary",
    "explanation",
    "fleet",
    "pareto",
    "curves",
    "frontier",
    "history",
    "importance",
    "noise",
    "time",
    "failures",
    "top",
]
"""Every section, in the page's order; a study shows those it has something for."""
PLACEHOLDERS = [
    "No trial recorded a latency-throughput curve",
    "No explanation yet",
    "Needs at least 5 feasible",
    "No failed or infeasible trial",
    "No configuration was measured twice",
    "No completed trial yet",
    "No measured trial with throughput",
]
"""What the report used to show in a section it had nothing for: never again."""
PLOTS = ["plot-pareto", "plot-history", "plot-importance", "plot-time"]
PLANTED = '<script>alert("pwned")</script><i id="pwned">x</i>'
CHROMIUM = next(
    (p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()), None
)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # the report must not need the network
    "--virtual-time-budget=10000",
]


class Page(HTMLParser):
    """Collects what the assertions need: sections with their text, ids, scripts, URLs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, str] = {}
        self.ids: list[str] = []
        self.tags: dict[str, int] = {}
        self.urls: list[str] = []
        self._section: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        for key in ("src", "href"):
            if a.get(key):
                self.urls.append(str(a[key]))
        if tag == "section":
            self._section = a.get("id")
            self.sections[str(self._section)] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None

    def handle_data(self, data: str) -> None:
        if self._section is not None:
            self.sections[self._section] += data


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


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


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
    assert CHROMIUM is not None
    proc = subprocess.run(
        [
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "<section" in dom, proc.stderr[-2000:]
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
    from conftest_results import BASELINE_PARAMS

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


def figure(raw: str, div_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The data and layout a plot's ``Plotly.newPlot`` call gets, as embedded in the page."""
    match = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*', raw)
    assert match is not None, div_id
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(raw, match.end())
    comma = re.compile(r"\s*,\s*").match(raw, end)
    assert comma is not None
    layout, _ = decoder.raw_decode(raw, comma.end())
    return data, layout


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
    bundled = Path(__file__).resolve().parent.parent / "launchers" / "sim-dsv4-flash-pd.yaml"
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
        assert CHROMIUM is not None
        proc = subprocess.run(
            [
                CHROMIUM,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={tmp_path / ('profile-' + name)}",
                "--dump-dom",
                target.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "<section" in proc.stdout, proc.stderr[-2000:]
        return proc.stdout

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


# --- the explanation section (what `autotune explain` stored) ------------------------------

MOE = "moe_runner_backend"
OOM = "cuda_oom: CUDA out of memory while capturing graphs"


def measured(key: str, mean: float, half: float | None, n: int = 3) -> Measured:
    values = [mean + d for d in (-1.0, 1.0, 0.0)[:n]]
    return Measured(
        key=key,
        n=n,
        values=values,
        mean=Interval(
            value=mean,
            low=None if half is None else mean - half,
            high=None if half is None else mean + half,
        ),
    )


def iv(value: float, low: float, high: float) -> Interval:
    return Interval(value=value, low=low, high=high)


def effect(
    change: str,
    levers: dict[str, tuple[Any, Any]],
    without: Measured,
    contribution: Interval | None,
    **extra: Any,
) -> Effect:
    return Effect(
        change=change,
        levers=list(levers),
        baseline={k: b for k, (b, _) in levers.items()},
        winner={k: w for k, (_, w) in levers.items()},
        reverted=[change],
        without=without,
        contribution=contribution,
        relative=None if contribution is None else contribution.value / 1000.0,
        **extra,
    )


def an_explanation(winner: int, *, moe: str = MOE) -> Explanation:
    """Four changes from a baseline at 400 to a winner at 1000: cuda_graph is required (the
    winner without it runs out of memory), ``moe`` bought 400, mem_fraction_static 100 and
    nccl_proto (reverted with a partner: alone is forbidden) 10; the path adds them in that
    order; the minimal winner drops nccl_proto."""
    effects = [
        effect(
            "cuda_graph",
            {"cuda_graph": (True, False)},
            Measured(key="k-cg", failure=OOM),
            None,
            required=True,
        ),
        effect(
            moe, {MOE: ("marlin", "cutlass")}, measured("k-moe", 600.0, 25.0, 2), iv(400, 360, 440)
        ),
        effect(
            "mem_fraction_static",
            {"mem_fraction_static": (0.88, 0.93)},
            measured("k-mem", 900.0, 27.0, 2),
            iv(100, 40, 160),
        ),
        effect(
            "nccl_proto",
            {"nccl_proto": ("unset", "LL")},
            measured("k-nccl", 990.0, 28.0, 2),
            iv(10, -50, 70),
            note="reverting nccl_proto alone is refused (forbidden combination); reverted "
            "together with mem_fraction_static",
        ),
    ]
    win = measured("k-win", 1000.0, 30.0)
    path = [
        PathStep(added=["cuda_graph"], measured=measured("p1", 380.0, 19.0), step=iv(-20, -47, 7)),
        PathStep(added=[moe], measured=measured("p2", 760.0, 30.0), step=iv(380, 340, 420)),
        PathStep(
            added=["mem_fraction_static"],
            measured=measured("p3", 980.0, 30.0),
            step=iv(220, 180, 260),
        ),
        PathStep(added=["nccl_proto"], measured=win, step=iv(20, -20, 60)),
    ]
    decisions = [
        Decision(
            change="nccl_proto",
            action="dropped",
            why="without it 985.0 (n=3, lower bound 956.0), within 3% of the winner's lower "
            "bound 970.0",
        ),
        Decision(
            change="mem_fraction_static",
            action="kept",
            why="without it 890.0 (n=3), below 97% of the winner's lower bound 970.0",
        ),
        Decision(change=moe, action="kept", why="without it 590.0 (n=2), below 97%"),
        Decision(change="cuda_graph", action="kept", why=f"the winner without it fails ({OOM})"),
    ]
    kept = ["cuda_graph", moe, "mem_fraction_static"]
    return Explanation(
        winner=winner,
        unit="tok/s",
        objective="output throughput",
        tolerance=0.03,
        winner_config={**BASELINE_PARAMS, MOE: "cutlass", "cuda_graph": False},
        baseline_config=dict(BASELINE_PARAMS),
        winner_measured=win,
        baseline_measured=measured("k-base", 400.0, 20.0, 2),
        noise_sd=0.02,
        noise_df=20,
        effects=effects,
        path=path,
        minimal=Minimal(
            kept=kept,
            dropped=["nccl_proto"],
            config={**BASELINE_PARAMS, MOE: "cutlass", "cuda_graph": False},
            measured=measured("k-min", 985.0, 29.0),
            ratio=iv(0.985, 0.95, 1.02),
            decisions=decisions,
            complete=True,
        ),
        runs=26,
        complete=True,
    )


def explained(study: optuna.Study, **kwargs: Any) -> Explanation:
    """Store an explanation of the study's winner, as `autotune explain` does."""
    estimate = best_estimate(study)
    assert estimate is not None
    expl = an_explanation(estimate.trial.number, **kwargs)
    study.set_user_attr(RESULT_ATTR, expl.model_dump(mode="json"))
    return expl


def section_html(raw: str, anchor: str) -> str:
    start = raw.index(f'<section id="{anchor}">')
    return raw[start : raw.index("</section>", start)]


def section_text(raw: str, anchor: str) -> str:
    """The section's text with every tag a space (table cells stay apart), scripts left out."""
    body = re.sub(r"<script.*?</script>", " ", section_html(raw, anchor), flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", body)).split())


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
