"""``explain: {enabled: true}`` in a study file: ``autotune run`` explains its winner at the
end (real simulated servers on loopback, SQLite), and a bad ``explain:`` section is refused
when the study file is loaded, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import load
from test_explain_twin import DEPLOYMENT, SPACE, cli
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import ConfigError
from autotune.explain import load_explanation, load_runs, load_state
from autotune.explain.record import RUN_PREFIX
from autotune.study.definition import load_study_definition

STUDY = "hook"
FLASHMLA = "sm120_flashmla_backend + sm120_direct_swa_kv"


def _study_file(path: Path, explain: str) -> Path:
    """A fast study (like tests/data/e2e-study.yaml, absolute paths) whose enqueued trial,
    the winner, changes one thing from the baseline."""
    path.write_text(
        f"name: {STUDY}\nspace: {SPACE}\ndeployment: {DEPLOYMENT}\nobjective: throughput\n"
        "load:\n  concurrency: 4\n  input_len: 64\n  output_len: 6\n  warmup_requests: 2\n"
        "  requests: 4\n  max_duration_s: 40\n  request_timeout_s: 40\n"
        "correctness:\n  max_tokens: 3\n"
        "remeasure: {budget: 0}\n"
        "enqueue:\n  - {sm120_flashmla_backend: flashinfer, sm120_direct_swa_kv: true}\n"
        f"explain: {explain}\n"
    )
    return path


def test_run_explains_its_winner_at_the_end(tmp_path: Path) -> None:
    study_file = _study_file(
        tmp_path / "hook.yaml",
        "{enabled: true, repeats: 1, max_repeats: 1, budget: 4, path: false}",
    )
    db = tmp_path / "hook.db"
    done = cli(
        "run", "--trials", "4", "--seed", "1", "--study", STUDY,
        "--storage", f"sqlite:///{db}", "--study-file", str(study_file), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"explaining trial #1: 1 change(s) from the baseline ({FLASHMLA})" in done.stdout
    study = load(STUDY, db)
    attrs = study.user_attrs
    runs = {k: v for k, v in attrs.items() if k.startswith(RUN_PREFIX)}
    assert 2 <= len(runs) <= 4  # the winner and the baseline at least, within the budget
    assert all(r["failure"] is None and r["services"] for r in runs.values())
    assert {r["index"] for r in runs.values()} == {0}  # repeats: 1
    assert len(study.trials) == 4  # explanation runs are no trials
    explanation = load_explanation(study)
    assert explanation is not None and "explain:result" in attrs
    assert explanation.winner == 1 and explanation.complete and explanation.stopped is None
    assert explanation.runs == len(runs) and explanation.path == []  # path: false
    assert [x.change for x in explanation.effects] == [FLASHMLA]
    assert explanation.minimal is not None and explanation.minimal.kept == [FLASHMLA]
    assert explanation.winner_measured.key in load_runs(study)
    state = load_state(study)
    assert state is not None and state.winner == 1 and state.runs == len(runs)


def test_max_repeats_below_repeats_is_refused_when_the_study_file_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study_file = _study_file(tmp_path / "bad.yaml", "{repeats: 3, max_repeats: 2}")
    with pytest.raises(ConfigError) as caught:
        load_study_definition(study_file)
    assert caught.value.field == "explain"
    assert caught.value.file == str(study_file)
    assert "max_repeats (2) must be at least repeats (3)" in caught.value.message

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "bad.db"
    result = CliRunner().invoke(
        app,
        ["run", "--trials", "1", "--study", STUDY, "--storage", f"sqlite:///{db}",
         "--study-file", str(study_file)],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        f"error: {study_file}: field 'explain': max_repeats (2) must be at least repeats (3)"
    ], result.output
    assert not db.exists()  # refused before the study was created
