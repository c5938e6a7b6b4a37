"""The kinds of GPU a study's runs came from (autotune/study/cards.py): a run's kind from its
telemetry, the warning when a new kind joins a study, and what ``best`` and the report say of
a study that ran on two kinds (issue 28's dense random arm, stored: 13 runs on H200s, its
last 6 launches on H100s)."""

from __future__ import annotations

import shutil
from pathlib import Path

from e2e_helpers import autotune_cli, load

from autotune.results import cards_text
from autotune.study.cards import CardWatch
from autotune.telemetry import Telemetry
from autotune.telemetry.model import GpuTelemetry

REPO = Path(__file__).resolve().parents[2]
RANDOM_DB = REPO / "benchmarks" / "h200" / "vllm-h200-dense-random.db"


def _telemetry(*names: str) -> Telemetry:
    gpus = [GpuTelemetry(index=i, uuid=f"GPU-{i}", name=n) for i, n in enumerate(names)]
    return Telemetry(source="nvml", gpus=gpus)


def test_a_runs_kind_of_gpu_is_nvmls_name_counted_per_kind() -> None:
    assert _telemetry("NVIDIA H200").card == "NVIDIA H200"
    assert _telemetry("NVIDIA H200", "NVIDIA H200").card == "2x NVIDIA H200"
    mixed = _telemetry("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H200")
    assert mixed.card == "NVIDIA H100 80GB HBM3, 2x NVIDIA H200"
    assert _telemetry("").card is None  # NVML gave no name
    assert Telemetry.none("NVML not available").card is None


def test_a_new_kind_is_said_once_and_never_for_the_first_or_a_cpu() -> None:
    watch = CardWatch()
    assert watch.observe("NVIDIA H200", run="the run of #0") is None  # the study's first
    assert watch.observe("NVIDIA H200", run="the run of #1") is None
    assert watch.observe(None, run="the run of #2") is None  # no telemetry: nothing to say
    warning = watch.observe("NVIDIA H100 80GB HBM3", run="the run of #3")
    assert warning is not None
    assert warning.startswith(
        "warning: the run of #3 ran on NVIDIA H100 80GB HBM3; the study's earlier runs on "
        "NVIDIA H200 (2): its ranking now compares kinds of GPU"
    )
    assert watch.observe("NVIDIA H100 80GB HBM3", run="the run of #4") is None  # said once
    assert dict(watch.seen) == {"NVIDIA H200": 2, "NVIDIA H100 80GB HBM3": 2}


def test_best_says_which_kinds_a_study_ran_on() -> None:
    assert cards_text({"NVIDIA H200": 3}, ["NVIDIA H200"]) is None  # one kind: nothing
    assert cards_text({}, [None]) is None
    text = cards_text({"NVIDIA H200": 13, "NVIDIA H100 80GB HBM3": 6}, ["NVIDIA H200", None])
    assert text == (
        "2 kinds of GPU (NVIDIA H200: 13, NVIDIA H100 80GB HBM3: 6 runs): the ranking "
        "compares runs across them; the winner's ran on NVIDIA H200"
    )


def test_best_on_the_stored_random_arm_that_ran_on_h200s_and_h100s(tmp_path: Path) -> None:
    db = tmp_path / "random.db"
    shutil.copyfile(RANDOM_DB, db)
    best = autotune_cli(
        "best", "--study", "vllm-h200-dense-random", "--storage", f"sqlite:///{db}",
        cwd=tmp_path,
    )  # fmt: skip
    assert best.returncode == 0, best.stdout + best.stderr
    text = " ".join(best.stdout.replace("│", " ").split())
    assert "best feasible trial #19" in text
    assert (
        "the study's GPUs 2 kinds of GPU (NVIDIA H200: 13, NVIDIA H100 80GB HBM3: 6 runs): "
        "the ranking compares runs across them; the winner's ran on NVIDIA H200"
    ) in text
    report = autotune_cli(
        "report", "--study", "vllm-h200-dense-random", "--storage", f"sqlite:///{db}",
        "--out", "r.html", cwd=tmp_path,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "GPU kinds" in html
    assert "2 kinds of GPU (NVIDIA H200: 13, NVIDIA H100 80GB HBM3: 6 runs)" in html
    watch = CardWatch.from_study(load("vllm-h200-dense-random", db))
    assert dict(watch.seen) == {"NVIDIA H200": 13, "NVIDIA H100 80GB HBM3": 6}
