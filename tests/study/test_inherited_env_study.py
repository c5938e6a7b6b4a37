"""A study on the simulated deployment, over four sessions whose shells differ: what the
services inherited is stored per trial, an identical configuration is reused only where the
inheritance matches, a session says what changed, and the export sets the inherited values.

The services are real processes started by the local manager with autotune's environment
(``monkeypatch.setenv`` here is the shell that ran ``autotune run``)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from e2e_helpers import E2E_STUDY, autotune_cli, load

from autotune.export import export
from autotune.results import TrialResult, load_remeasurements
from autotune.study.definition import load_study_definition
from autotune.study.progress import NullProgress
from autotune.study.runner import Tuner

VAR = "TORCH_SHOW_CPP_STACKTRACES"  # a PyTorch variable: inherited, harmless to the sim
SECRET = "hf_inherited_env_planted_secret"


class Said(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def _session(
    tmp_path: Path, n_trials: int, *, again_baseline: bool, remeasure: str | None = None
) -> list[str]:
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    study_file = E2E_STUDY
    if remeasure is not None:
        study_file = tmp_path / "study.yaml"
        data = yaml.safe_load(E2E_STUDY.read_text())
        data["space"] = str(E2E_STUDY.parent / data["space"])
        data["deployment"] = str(E2E_STUDY.parent / data["deployment"])
        data["remeasure"] = yaml.safe_load(remeasure)
        study_file.write_text(yaml.safe_dump(data))
    definition = load_study_definition(study_file)
    said = Said()
    tuner = Tuner(definition=definition, study_name="inh", storage_url=url, seed=3, progress=said)
    if again_baseline:  # the sampler proposing a configuration measured before
        optuna.load_study(study_name="inh", storage=url).enqueue_trial(
            tuner.space.baseline_params()
        )
    tuner.run(n_trials=n_trials)
    return said.lines


def test_a_changed_shell_is_recorded_said_not_reused_and_exported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(VAR, "1")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    _session(tmp_path, 1, again_baseline=False)
    _session(tmp_path, 2, again_baseline=True)
    monkeypatch.setenv(VAR, "0")
    third = _session(tmp_path, 3, again_baseline=True)
    fourth = _session(tmp_path, 4, again_baseline=True)

    trials = sorted(load("inh", tmp_path / "s.db").get_trials(), key=lambda t: t.number)
    assert len(trials) == 4
    inherited = [
        {name: svc["inherited_env"] for name, svc in t.user_attrs["services"].items()}
        for t in trials
    ]
    assert all(t.user_attrs["schema_version"] == 8 for t in trials)
    # Every service of the sim deployment is local: each recorded the variable.
    assert all(envs and all(e is not None for e in envs.values()) for envs in inherited)
    assert [{e[VAR] for e in envs.values()} for envs in inherited] == [{"1"}, {"1"}, {"0"}, {"0"}]
    for t in trials:
        assert all(
            "HF_TOKEN" not in (svc["inherited_env"] or {})
            for svc in t.user_attrs["services"].values()
        )
        assert SECRET not in repr(t.user_attrs), "a secret of the environment was stored"
    # #1 = #0's config in the same shell: reused. #2: the shell changed: measured again.
    # #3: reused from #2 (same shell), not from #0.
    assert [t.user_attrs["reused_from"] for t in trials] == [None, 0, None, 2]
    assert trials[2].user_attrs["config"] == trials[0].user_attrs["config"]
    assert trials[2].user_attrs["phase_seconds"]["measure"] > 0
    assert any(
        "environment differs from trial #1's" in line and f"{VAR}: 1 then, 0 now" in line
        for line in third
    ), third
    assert any("trial #0's identical configuration is measured again" in line for line in third)
    assert not any("differs" in line or "measured again" in line for line in fourth), fourth

    result = TrialResult.from_frozen(trials[2])
    text = export(result, fmt="command", out_dir=None, notes=None)
    assert isinstance(text, str) and f"{VAR}=0" in text
    storage = f"sqlite:///{tmp_path / 's.db'}"
    best = autotune_cli("best", "--study", "inh", "--storage", storage, cwd=tmp_path)
    assert "prefill inherited" in best.stdout and f"{VAR}=" in best.stdout, best.stdout

    # `autotune status` compares this shell with the newest trial (#3, at 0) given the file
    status = ("status", "--study", "inh", "--storage", storage)
    with_file = (*status, "--study-file", str(E2E_STUDY))
    same = json.loads(autotune_cli(*with_file, "--json", cwd=tmp_path).stdout)["environment"]
    assert same == {"trial": 3, "changes": [], "error": None}
    monkeypatch.setenv(VAR, "1")
    other = json.loads(autotune_cli(*with_file, "--json", cwd=tmp_path).stdout)["environment"]
    assert other["trial"] == 3 and f"prefill: {VAR}: 0 then, 1 now" in other["changes"], other
    text = autotune_cli(*with_file, cwd=tmp_path).stdout
    assert "environment" in text and "differs from trial #3's" in text, text
    # no study file at hand (none under studies/ here): not asked
    assert json.loads(autotune_cli(*status, "--json", cwd=tmp_path).stdout)["environment"] is None
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: inh\nspace: nowhere.yaml\n")
    said = json.loads(
        autotune_cli(*status, "--study-file", str(broken), "--json", cwd=tmp_path).stdout
    )["environment"]
    assert said["trial"] is None and said["error"].startswith(str(broken)), said
    missing = autotune_cli(*status, "--study-file", "nope.yaml", cwd=tmp_path, check=False)
    assert missing.returncode != 0 and "nope.yaml" in missing.stdout + missing.stderr


def test_a_race_does_not_pool_runs_of_two_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trials measured with the variable at 1; the re-measurement phase reached in a shell
    where it is 0 stops before measuring (its runs would be pooled with the trials' own);
    back at 1, it re-measures."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(VAR, "1")
    _session(tmp_path, 2, again_baseline=False, remeasure="{policy: fixed, top_k: 0}")
    monkeypatch.setenv(VAR, "0")
    said = _session(
        tmp_path, 2, again_baseline=False, remeasure="{policy: fixed, top_k: 2, repeats: 1}"
    )
    study = load("inh", tmp_path / "s.db")
    assert load_remeasurements(study) == []
    assert any(
        line.startswith("re-measuring stops: trial #") and f"{VAR}: 1 then, 0 now" in line
        for line in said
    ), said
    monkeypatch.setenv(VAR, "1")
    said = _session(
        tmp_path, 2, again_baseline=False, remeasure="{policy: fixed, top_k: 2, repeats: 1}"
    )
    trials = load("inh", tmp_path / "s.db").get_trials()
    measured = {t.number for t in trials if t.user_attrs.get("failure") is None}
    runs = load_remeasurements(load("inh", tmp_path / "s.db"))
    again = {m.of for m in runs}
    assert again and again <= measured, (again, measured)
    # each re-measurement records what its services inherited, as a trial does
    stored = [v for k, v in study.user_attrs.items() if k.startswith("remeasure:")]
    assert len(stored) == len(runs)
    for attrs in stored:
        assert {e[VAR] for e in attrs["inherited_env"].values()} == {"1"}, attrs
    assert not any("re-measuring stops" in line for line in said), said
