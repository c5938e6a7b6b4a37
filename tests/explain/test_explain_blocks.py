"""An explanation's runs on several GPUs, read with the GPU as a block
(:mod:`autotune.explain.blocks`): a GPU's offset that the pooled means carry into a change's
contribution is taken out; where no shared GPU links a change's two sides nothing is claimed;
on one GPU, or without GPU telemetry, nothing is added. Then the stored H100 explanation as
``autotune explain --show`` and the report give it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import optuna
import pytest

from autotune.explain import (
    Effect,
    Explanation,
    Interval,
    Measured,
    gpu_blocked,
    load_explanation,
    load_runs,
)
from autotune.explain.record import ExplainRun
from autotune.telemetry import GpuTelemetry, Telemetry

ROOT = Path(__file__).resolve().parents[2]
DENSE_H100 = ROOT / "benchmarks" / "h100" / "vllm-h200-dense-explain-h100.db"


def _measured(key: str) -> Measured:
    return Measured(key=key, n=1, values=[1.0], mean=Interval(value=1.0))


def _explanation(*reverts: str) -> Explanation:
    return Explanation(
        winner=7,
        unit="tok/s",
        objective="output throughput",
        tolerance=0.03,
        winner_config={},
        baseline_config={},
        winner_measured=_measured("win"),
        baseline_measured=_measured("base"),
        effects=[
            Effect(
                change=r, levers=[r], winner={}, baseline={}, reverted=[r], without=_measured(r)
            )  # fmt: skip
            for r in reverts
        ],
        complete=True,
    )


def _run(key: str, index: int, value: float, gpu: str | None) -> ExplainRun:
    telemetry = (
        Telemetry.none("no NVML")
        if gpu is None
        else Telemetry(source="nvml", gpus=[GpuTelemetry(index=0, uuid=gpu, name="H100")])
    )
    return ExplainRun(key=key, index=index, values=[value], feasible=True, telemetry=telemetry)


def _runs(plan: Mapping[str, Sequence[tuple[float, str | None]]]) -> dict[str, list[ExplainRun]]:
    return {
        key: [_run(key, i, v, g) for i, (v, g) in enumerate(runs)] for key, runs in plan.items()
    }


# the truth: the winner 1000 tok/s, without "a" 900 (a 10% share), without "b" 1000 (none);
# GPU-y serves everything 10% slower than GPU-x; +-0.5% of noise, fixed
WOBBLE = [1.005, 0.995, 1.0]


def test_a_gpus_offset_is_taken_out_of_each_share() -> None:
    runs = _runs(
        {
            "win": [(1000 * w, "GPU-x") for w in WOBBLE],
            "a": [(900 * 0.9 * w, "GPU-y") for w in WOBBLE[:2]] + [(900.0, "GPU-x")],
            "b": [(1000 * 0.9 * w, "GPU-y") for w in WOBBLE[:2]] + [(1000.0, "GPU-x")],
        }
    )
    pooled_b = 1 - (2 * 900 + 1000) / 3 / 1000
    assert pooled_b > 0.06  # the pooled means read GPU-y's 10% as b's share
    blocks = gpu_blocked(_explanation("a", "b"), runs)
    assert blocks is not None
    a, b = blocks.shares["a"], blocks.shares["b"]
    assert a is not None and b is not None
    assert a.value == pytest.approx(0.10, abs=0.006) and b.value == pytest.approx(0.0, abs=0.006)
    assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
    assert 0 < a.low < 0.10 < a.high and b.low < 0 < b.high
    offsets = blocks.fit.gpu_offsets()
    assert offsets["GPU-x"] == 0.0 and offsets["GPU-y"] == pytest.approx(-0.10, abs=0.006)
    assert blocks.describe().startswith("with the GPU as a block (2 GPUs: GPU-x +0.0%, GPU-y -10")


def test_a_change_whose_sides_share_no_gpu_is_not_read() -> None:
    """The revert ran only on GPU-y, the winner only on GPU-x, and nothing else links them
    through GPU-y: the offset and the change cannot be told apart. A revert that never ran
    (a failed start) is said to be not measured."""
    runs = _runs(
        {
            "win": [(1000.0, "GPU-x"), (1005.0, "GPU-x")],
            "a": [(810.0, "GPU-y"), (815.0, "GPU-y")],
            "b": [(1000.0, "GPU-x"), (990.0, "GPU-x")],
        }
    )
    blocks = gpu_blocked(_explanation("a", "b", "c"), runs)  # c: its revert never ran
    assert blocks is not None and blocks.shares["a"] is None and blocks.shares["c"] is None
    assert blocks.share_text("a") == "not linked by a shared GPU"
    assert blocks.share_text("c") == "not measured"
    b = blocks.shares["b"]
    assert b is not None and b.value == pytest.approx(
        1 - math.sqrt(1000 * 990) / math.sqrt(1000 * 1005), abs=1e-3
    )


def test_on_one_gpu_or_without_telemetry_nothing_is_added() -> None:
    one = _runs({"win": [(1000.0, "GPU-x")] * 2, "a": [(900.0, "GPU-x")] * 2})
    assert gpu_blocked(_explanation("a"), one) is None
    unknown = _runs({"win": [(1000.0, "GPU-x")] * 2, "a": [(900.0, None)] * 2})
    assert gpu_blocked(_explanation("a"), unknown) is None


def test_the_h100_explanation_with_the_gpu_as_a_block_in_show_and_the_report(
    tmp_path: Path,
) -> None:
    """The dense 7B winner on four H100s (BENCHMARKS.md, "The H200 winner explained on an
    H100"): `autotune explain --show` adds the column and the GPUs' offsets, the report the
    same as a note; the two fp8 levers stay above zero, the five small changes straddle it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="vllm-h200-dense", storage=f"sqlite:///{DENSE_H100}")
    e = load_explanation(study)
    assert e is not None
    blocks = gpu_blocked(e, load_runs(study))
    assert blocks is not None and blocks.fit.df == 11
    for change, share in blocks.shares.items():
        assert share is not None and share.low is not None and share.high is not None
        assert (share.low > 0) == (change in ("quantization", "kv_cache_dtype")), change
    db = tmp_path / "dense.db"
    db.write_bytes(DENSE_H100.read_bytes())  # the report and --show only read; a copy anyway
    env = {**os.environ, "COLUMNS": "300"}
    common = ["--study", "vllm-h200-dense", "--storage", f"sqlite:///{db}"]
    shown = subprocess.run(
        [sys.executable, "-m", "autotune", "explain", *common, "--show"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "with the GPU as a block (4 GPUs: GPU-15864ad5 +0.0%, GPU-d64d6eee +2.6%" in text
    assert "share, the GPU as a block" in text
    assert "│ +22.2% │ +23.2% (+21.0% to +25.4%) │" in text
    report = tmp_path / "r.html"
    made = subprocess.run(
        [sys.executable, "-m", "autotune", "report", *common, "--out", str(report)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    html = report.read_text()
    assert "The runs span GPUs; with the GPU as a block (4 GPUs:" in html
    assert "quantization +23.2% (+21.0% to +25.4%)" in html
