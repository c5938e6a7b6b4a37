"""``autotune best --minimal``: the stored explanation's minimal winner, printed and exported.

In-process (typer's CliRunner), on studies written directly: trials from the shared factory
(tests/conftest_results.py), and what ``autotune explain`` leaves behind (an
``Explanation`` under ``explain:result``, its runs under ``explain:run:KEY:I``). The
minimal winner's services are the ones its run started, so its exports carry its own flags,
not the winner's. The twin end to end is in test_explain_twin.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest_results import (
    BASELINE_PARAMS,
    TrialSpec,
    make_study,
    metrics,
    services,
)
from systemd_verify import SYSTEMD_ANALYZE, verify
from typer.testing import CliRunner

from autotune.cli import app
from autotune.explain import ExplainRun, Explanation, Interval, Measured, Minimal
from autotune.explain.record import RESULT_ATTR, Decision, run_key

STUDY = "autotune-test"
WINNER = 1
WINNER_PARAMS = {
    **BASELINE_PARAMS,
    "moe_runner_backend": "cutlass",
    "mem_fraction_static": 0.80,
    "nccl_proto": "LL",
}
# moe_runner_backend bought the gain; mem_fraction_static and nccl_proto are dropped
MINIMAL_PARAMS = {**BASELINE_PARAMS, "moe_runner_backend": "cutlass"}
KEPT = ["moe_runner_backend"]
DROPPED = ["mem_fraction_static", "nccl_proto"]
MIN_KEY = "k-minimal"


def _study(tmp_path: Path) -> optuna.Study:
    """The baseline (#0), the winner (#1) and a runner-up (#2)."""
    return make_study(
        tmp_path,
        [
            TrialSpec(throughput=25.0, is_baseline=True),
            TrialSpec(throughput=1000.0, params=WINNER_PARAMS),
            TrialSpec(throughput=500.0, params={**BASELINE_PARAMS, "nccl_proto": "LL"}),
        ],
        name=STUDY,
    )


def _measured(key: str, mean: float, n: int = 2) -> Measured:
    return Measured(
        key=key,
        n=n,
        values=[mean] * n,
        mean=Interval(value=mean, low=mean - 10, high=mean + 10),
    )


def _explanation(
    *, winner: int = WINNER, dropped: list[str] | None = None, complete: bool = True
) -> Explanation:
    dropped = DROPPED if dropped is None else dropped
    kept = [c for c in ("moe_runner_backend", *DROPPED) if c not in dropped]
    config = {**WINNER_PARAMS, **{k: BASELINE_PARAMS[k] for k in dropped}}
    decisions = [
        Decision(change=c, action="dropped", why=f"without it 980.0: within 3% ({c})", key="k")
        for c in dropped
    ] + [Decision(change=c, action="kept", why=f"without it 30.0: below 97% ({c})") for c in kept]
    return Explanation(
        winner=winner,
        unit="tok/s",
        objective="output throughput",
        tolerance=0.03,
        winner_config=dict(WINNER_PARAMS),
        baseline_config=dict(BASELINE_PARAMS),
        winner_measured=_measured("k-winner", 1000.0),
        baseline_measured=_measured("k-base", 25.0),
        minimal=Minimal(
            kept=kept,
            dropped=dropped,
            config=config,
            measured=_measured(MIN_KEY if dropped else "k-winner", 980.0 if dropped else 1000.0),
            ratio=Interval(value=0.98, low=0.96, high=1.0) if dropped else None,
            decisions=decisions,
            complete=complete,
        ),
        runs=6,
        complete=complete,
    )


def _run(index: int, params: dict[str, Any], *, failure: str | None = None) -> ExplainRun:
    return ExplainRun(
        key=MIN_KEY,
        index=index,
        config={**params, "speculative_num_draft_tokens": 4},
        values=[] if failure else [980.0],
        feasible=failure is None,
        failure=failure,
        reason="CUDA out of memory" if failure else None,
        metrics={} if failure else metrics(980.0, 40.0),
        services=services(params),  # type: ignore[arg-type]
        engine_version={"sglang": "0.5.23"},
    )


def _store(study: optuna.Study, explanation: Explanation | None, runs: list[ExplainRun]) -> None:
    if explanation is not None:
        study.set_user_attr(RESULT_ATTR, explanation.model_dump(mode="json"))
    for run in runs:
        study.set_user_attr(run_key(run.key, run.index), run.model_dump(mode="json"))


@pytest.fixture()
def explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A study whose winner's minimal winner dropped two of three changes: its first run
    succeeded, a later one failed (it does not count). Returns the storage URL."""
    monkeypatch.chdir(tmp_path)  # no studies/STUDY.yaml to supply secrets from
    study = _study(tmp_path / "db")
    _store(
        study,
        _explanation(),
        [_run(0, MINIMAL_PARAMS), _run(1, WINNER_PARAMS, failure="cuda_oom")],
    )
    return f"sqlite:///{tmp_path / 'db' / 'study.db'}"


def best(storage: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["best", "--study", STUDY, "--storage", storage, *args], env={"COLUMNS": "200"}
    )
    return result.exit_code, result.output


def _service_line(text: str, service: str) -> str:
    lines = text.splitlines()
    return lines[lines.index(f"# --- {service}") + 1]


def test_best_minimal_prints_what_was_kept_and_dropped(explained: str) -> None:
    code, out = best(explained, "--minimal")
    assert code == 0, out
    assert "minimal winner of trial #1" in out
    assert "changes kept" in out and "changes dropped" in out
    kept = next(line for line in out.splitlines() if "changes kept" in line)
    dropped = next(line for line in out.splitlines() if "changes dropped" in line)
    assert "moe_runner_backend" in kept and "nccl_proto" not in kept
    assert "mem_fraction_static, nccl_proto" in dropped
    assert "980.0 +- 10.0 tok/s (95% CI, n=2)" in out
    assert "0.980 [0.960, 1.000] (tolerance 3%)" in out
    assert "39.2x" in out  # gain over the baseline's 25 tok/s
    assert "dropped nccl_proto" in out and "kept moe_runner_backend" in out
    assert "--mem-fraction-static 0.88" in out  # the minimal winner's command, not the winner's
    assert "did not finish" not in out


def test_export_command_is_the_minimal_winners_command_lines(explained: str) -> None:
    code, text = best(explained, "--minimal", "--export", "command")
    assert code == 0, text
    assert text.startswith("# autotune trial 1 (minimal winner): start each service")
    prefill = _service_line(text, "prefill")
    assert "--moe-runner-backend cutlass" in prefill  # kept
    assert "--mem-fraction-static 0.88" in prefill  # dropped: at the baseline
    assert "-u NCCL_PROTO" in prefill and "NCCL_PROTO=LL" not in prefill  # dropped: unset
    # the winner itself, for contrast
    code, full = best(explained, "--export", "command")
    assert code == 0 and full.startswith("# autotune trial 1: start each service")
    winner = _service_line(full, "prefill")
    assert "--mem-fraction-static 0.8 " in winner and "NCCL_PROTO=LL" in winner


def test_export_json_marks_the_minimal_winner(explained: str) -> None:
    code, text = best(explained, "--minimal", "--export", "json")
    assert code == 0, text
    doc = json.loads(text)
    assert doc["trial"] == WINNER and doc["minimal_winner"] is True
    assert doc["config"] == {**MINIMAL_PARAMS, "speculative_num_draft_tokens": 4}
    assert doc["output_throughput_tok_s"] == 980.0
    assert doc["values"] == {"output_throughput_tok_s": 980.0}
    assert doc["feasible"] is True and doc["engine_version"] == {"sglang": "0.5.23"}
    assert "--mem-fraction-static 0.88" in doc["services"]["prefill"]["command"]
    code, text = best(explained, "--export", "json")
    assert code == 0 and "minimal_winner" not in json.loads(text)


def test_export_env_writes_the_minimal_file(explained: str, tmp_path: Path) -> None:
    out = tmp_path / "env"
    code, output = best(explained, "--minimal", "--export", "env", "--out", str(out))
    assert code == 0, output
    path = out / "trial-1-minimal.env.sh"
    assert [p.name for p in out.iterdir()] == [path.name]
    assert str(path) in output
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# autotune trial 1 (minimal winner): environment per service")
    assert "unset NCCL_PROTO" in text and "NCCL_PROTO=LL" not in text


def test_export_systemd_names_the_minimal_winner_and_verifies(
    explained: str, tmp_path: Path
) -> None:
    out = tmp_path / "units-out"
    code, output = best(explained, "--minimal", "--export", "systemd", "--out", str(out))
    assert code == 0, output
    units = sorted((out / "units").glob("*.service"))
    assert [u.name for u in units] == [
        "autotune-decode.service",
        "autotune-prefill.service",
        "autotune-router.service",
    ]
    for unit in units:
        text = unit.read_text(encoding="utf-8")
        service = unit.stem.removeprefix("autotune-")
        assert f"Description=autotune {service} (trial 1 (minimal winner))" in text
    prefill = (out / "units" / "autotune-prefill.service").read_text(encoding="utf-8")
    exec_start = next(line for line in prefill.splitlines() if line.startswith("ExecStart="))
    assert "--mem-fraction-static 0.88" in exec_start
    assert "NCCL_PROTO" not in prefill.replace("UnsetEnvironment=NCCL_PROTO", "")
    assert "autotune export: trial 1 (minimal winner)" in (out / "README.txt").read_text()
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze not installed (Debian package: systemd)")
    for unit in units:
        proc = verify(unit)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_minimal_winner_with_nothing_dropped_is_the_winner_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    study = _study(tmp_path / "db")
    _store(study, _explanation(dropped=[]), [])  # no run of its own needed: it is the winner
    storage = f"sqlite:///{tmp_path / 'db' / 'study.db'}"
    code, out = best(storage, "--minimal")
    assert code == 0, out
    assert "none: every change is needed" in out
    code, text = best(storage, "--minimal", "--export", "command")
    assert code == 0, text
    assert text.startswith("# autotune trial 1: start each service")  # no "(minimal winner)"
    assert "--mem-fraction-static 0.8 " in _service_line(text, "prefill")
    code, text = best(storage, "--minimal", "--export", "json")
    assert code == 0 and "minimal_winner" not in json.loads(text)


def test_an_unfinished_minimal_search_is_said_and_still_exported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    study = _study(tmp_path / "db")
    _store(study, _explanation(complete=False), [_run(0, MINIMAL_PARAMS)])
    code, out = best(f"sqlite:///{tmp_path / 'db' / 'study.db'}", "--minimal", "--export", "json")
    assert code == 0, out
    assert "note: the minimal-winner search did not finish" in out
    assert '"minimal_winner": true' in out


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and "Traceback" not in output
    return lines[0]


@pytest.mark.parametrize(
    ("explanation", "runs", "words"),
    [
        (None, [], f"study '{STUDY}' has no explanation yet: run `autotune explain --study"),
        (
            _explanation(winner=2),
            [_run(0, MINIMAL_PARAMS)],
            "the stored explanation is of trial #2, but the winner is now #1: run `autotune "
            "explain` again",
        ),
        (
            _explanation().model_copy(update={"minimal": None}),
            [],
            "has no minimal winner (it ran with --no-minimal)",
        ),
        (
            _explanation(),
            [_run(0, MINIMAL_PARAMS, failure="cuda_oom")],
            "the minimal winner of trial #1 has no successful run stored",
        ),
    ],
    ids=["no-explanation", "another-winner", "no-minimal", "no-successful-run"],
)
@pytest.mark.parametrize("export", [None, "command"])
def test_what_cannot_be_exported_is_one_error_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    explanation: Explanation | None,
    runs: list[ExplainRun],
    words: str,
    export: str | None,
) -> None:
    monkeypatch.chdir(tmp_path)
    study = _study(tmp_path / "db")
    _store(study, explanation, runs)
    storage = f"sqlite:///{tmp_path / 'db' / 'study.db'}"
    code, out = best(storage, "--minimal", *(["--export", export] if export else []))
    assert code == 2
    assert words in _one_error_line(out)
