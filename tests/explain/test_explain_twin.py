"""``autotune explain`` end to end on the twin: real simulated servers on loopback, SQLite.

One small study is shared by the module (6 trials: the baseline and five enqueued variants,
whose winner changes three things from the baseline: the sparse-MLA backend together with
the lever only it activates, the decode's CUDA-graph batch size, an allocator setting).
With ``--repeats 1 --max-repeats 1`` every configuration of the plan is measured exactly
once, so a stored run measured again would show as a second index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, load

from autotune.errors import ConfigError
from autotune.explain import ExplainSettings, load_explanation, load_runs, load_state
from autotune.explain.record import RUN_PREFIX, Explanation
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
DEPLOYMENT = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
STUDY = "ex"
FLASHMLA = "sm120_flashmla_backend + sm120_direct_swa_kv"
CHANGES = [FLASHMLA, "cuda_graph_max_bs_decode", "pytorch_alloc_conf"]
FIRST_BUDGET = 3


def _study_file(path: Path, *, space: Path = SPACE, enqueue: bool = True) -> Path:
    text = (
        f"name: {STUDY}\nspace: {space}\ndeployment: {DEPLOYMENT}\nobjective: throughput\n"
        "load:\n  concurrency: 4\n  input_len: 64\n  output_len: 6\n  warmup_requests: 2\n"
        "  requests: 4\n  max_duration_s: 40\n  request_timeout_s: 40\n"
        "correctness:\n  max_tokens: 3\n"
        "remeasure: {budget: 0}\n"  # no race: the explanation is what is tested
    )
    if enqueue:
        text += (
            "enqueue:\n"
            "  - {sm120_flashmla_backend: flashinfer, sm120_direct_swa_kv: true,\n"
            "     cuda_graph_max_bs_decode: 32, pytorch_alloc_conf: 'expandable_segments:True'}\n"
            "  - {pytorch_alloc_conf: 'expandable_segments:True'}\n"
            "  - {cuda_graph_max_bs_decode: 32}\n"
            "  - {moe_runner_backend: triton}\n"
            "  - {nccl_proto: LL}\n"
        )
    path.write_text(text)
    return path


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real CLI, importing this checkout's autotune (not another editable install)."""
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "PYTHONPATH": pythonpath}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Twin:
    root: Path
    db: Path
    study_file: Path

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def common(self) -> list[str]:
        return ["--study", STUDY, "--storage", self.url, "--study-file", str(self.study_file)]

    def run_attrs(self) -> dict[str, Any]:
        attrs = load(STUDY, self.db).user_attrs
        return {k: v for k, v in attrs.items() if k.startswith(RUN_PREFIX)}

    def explanation(self) -> Explanation:
        found = load_explanation(load(STUDY, self.db))
        assert found is not None
        return found


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Twin:
    root = tmp_path_factory.mktemp("twin")
    t = Twin(root=root, db=root / "ex.db", study_file=_study_file(root / "ex.yaml"))
    done = cli("run", "--trials", "6", "--seed", "1", *t.common(), cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return t


@dataclass
class Explained:
    first: subprocess.CompletedProcess[str]
    after_first: dict[str, Any]
    first_result: Explanation
    second: subprocess.CompletedProcess[str]
    after_second: dict[str, Any]
    result: Explanation
    third: subprocess.CompletedProcess[str]
    after_third: dict[str, Any]


@pytest.fixture(scope="module")
def explained(twin: Twin) -> Explained:
    """The explanation stopped by its budget, resumed to the end, then asked again."""
    flags = ["--repeats", "1", "--max-repeats", "1"]
    first = cli("explain", *twin.common(), *flags, "--budget", str(FIRST_BUDGET), cwd=twin.root)
    assert first.returncode == 0, first.stdout + first.stderr
    after_first, first_result = twin.run_attrs(), twin.explanation()
    second = cli("explain", *twin.common(), *flags, "--budget", "40", cwd=twin.root)
    assert second.returncode == 0, second.stdout + second.stderr
    after_second, result = twin.run_attrs(), twin.explanation()
    third = cli("explain", *twin.common(), *flags, "--budget", "40", cwd=twin.root)
    assert third.returncode == 0, third.stdout + third.stderr
    return Explained(
        first, after_first, first_result, second, after_second, result, third, twin.run_attrs()
    )


def test_a_budget_stops_the_explanation_with_whole_runs_stored(
    twin: Twin, explained: Explained
) -> None:
    assert len(explained.after_first) == FIRST_BUDGET
    runs = [v for _, v in sorted(explained.after_first.items())]
    assert all(r["failure"] is None and r["values"][0] > 0 and r["services"] for r in runs)
    for name, raw in explained.after_first.items():
        assert name == f"{RUN_PREFIX}{raw['key']}:{raw['index']}"
    e = explained.first_result
    assert not e.complete and e.stopped == f"the budget of {FIRST_BUDGET} restarts is spent"
    assert e.runs == FIRST_BUDGET and e.minimal is None and e.path == []
    # round 1 of the ablation in order: the winner, the baseline, the first revert
    assert e.winner_measured.n == e.baseline_measured.n == 1
    effects = {x.change: x for x in e.effects}
    assert list(effects) == CHANGES
    assert effects[FLASHMLA].without.n == 1
    assert effects["cuda_graph_max_bs_decode"].without.n == 0
    assert "explanation stopped: the budget of 3 restarts is spent" in explained.first.stdout
    assert "incomplete: the budget of 3 restarts is spent" in explained.first.stdout


def test_the_resumed_explanation_measures_only_what_remains(
    twin: Twin, explained: Explained
) -> None:
    before, after = explained.after_first, explained.after_second
    assert before.items() <= after.items()  # the stored runs are untouched
    new = len(after) - len(before)
    e = explained.result
    assert e.complete and e.stopped is None and e.runs == len(after) and new > 0
    assert f"done: {new} runs in" in explained.second.stdout
    # every configuration of the plan once: nothing stored was measured again
    assert {raw["index"] for raw in after.values()} == {0}
    assert len({raw["key"] for raw in after.values()}) == len(after)
    state = load_state(load(STUDY, twin.db))
    assert state is not None and state.runs == len(after) and state.winner == e.winner
    assert state.order is not None and state.order[0] == FLASHMLA
    assert set(load_runs(load(STUDY, twin.db))) == {raw["key"] for raw in after.values()}
    # each run timed when stored (which machine was the latest, where GPUs are measured:
    # autotune.explain.occasions), the resumed invocation's after the first's
    first_done = max(raw["measured_at"] for raw in before.values())
    assert all(raw["measured_at"] > first_done for k, raw in after.items() if k not in before)
    # finished: asked again, nothing is measured
    assert explained.after_third == after
    assert "done: 0 runs in" in explained.third.stdout


def test_the_explanation_finds_the_change_that_matters(explained: Explained) -> None:
    e = explained.result
    effects = {x.change: x for x in e.effects}
    flashmla = effects[FLASHMLA]
    assert flashmla.note is not None
    assert "sm120_direct_swa_kv is inactive in the baseline" in flashmla.note
    assert flashmla.levers == ["sm120_flashmla_backend", "sm120_direct_swa_kv"]
    assert flashmla.contribution is not None and flashmla.relative is not None
    # the twin's model: the triton MLA backend is a fraction of flashinfer's speed
    assert flashmla.contribution.value > 0 and flashmla.relative > 0.5
    added = [name for step in e.path for name in step.added]
    assert sorted(added) == sorted(CHANGES) and added[0] == FLASHMLA  # largest first
    assert e.path[-1].measured.key == e.winner_measured.key
    assert e.minimal is not None and e.minimal.complete and FLASHMLA in e.minimal.kept
    assert {d.change for d in e.minimal.decisions} == set(CHANGES)


def test_show_prints_the_stored_explanation_and_measures_nothing(
    twin: Twin, explained: Explained
) -> None:
    shown = cli("explain", "--study", STUDY, "--storage", twin.url, "--show", cwd=twin.root)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"trial #{explained.result.winner}:" in out
    assert "what each change bought" in out and "from the baseline to the winner" in out
    assert "minimal winner:" in out
    for change in CHANGES:
        assert change in out
    assert twin.run_attrs() == explained.after_third


def test_a_space_without_a_baseline_is_a_config_error_naming_baseline(
    twin: Twin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the run directory
    text = SPACE.read_text()
    nobase = tmp_path / "nobase.yaml"
    nobase.write_text(text[: text.index("\nbaseline:")] + "\n")
    db = tmp_path / "copy.db"
    shutil.copy(twin.db, db)
    definition = load_study_definition(
        _study_file(tmp_path / "s.yaml", space=nobase, enqueue=False)
    )
    stored = load(STUDY, db).user_attrs
    tuner = Tuner(definition=definition, study_name=STUDY, storage_url=f"sqlite:///{db}")
    with pytest.raises(ConfigError) as caught:
        tuner.explain(ExplainSettings(repeats=1, max_repeats=1, budget=1))
    assert caught.value.field == "baseline"
    assert "baseline" in caught.value.message
    assert str(nobase) in str(caught.value)  # the file to fix
    after = load(STUDY, db).user_attrs
    assert {k: v for k, v in after.items() if k.startswith("explain:")} == {
        k: v for k, v in stored.items() if k.startswith("explain:")
    }  # nothing measured, nothing decided


def test_best_minimal_exports_the_minimal_winner_as_it_ran(
    twin: Twin, explained: Explained
) -> None:
    e = explained.result
    assert e.minimal is not None
    done = cli(
        "best", "--study", STUDY, "--storage", twin.url, "--minimal", "--export", "json",
        cwd=twin.root,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["trial"] == e.winner
    assert doc.get("minimal_winner", False) is bool(e.minimal.dropped)
    assert doc["config"] == e.minimal.config
    if e.minimal.dropped:  # the services as the minimal winner's last run started them
        runs = load_runs(load(STUDY, twin.db))[e.minimal.measured.key or ""]
        last = [r for r in runs if r.value is not None][-1]
        commands = {name: svc["command"] for name, svc in doc["services"].items()}
        assert commands == {name: svc.command for name, svc in last.services.items()}
        mean = e.minimal.measured.mean
        assert mean is not None and doc["output_throughput_tok_s"] == pytest.approx(mean.value)


def test_an_explanation_cut_between_runs_leaves_the_explanation_of_its_runs(
    twin: Twin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28's H100 lost its lease between two runs of an explanation, before the planner
    took a decision: the study held six runs and no explanation. Every run now stores the
    explanation so far (here Ctrl-C as the third run starts: the same stop, without the
    result written at the end); and ``--budget 0`` writes one from the stored runs alone."""
    from autotune.explain.record import RESULT_ATTR
    from autotune.study import explainer

    monkeypatch.chdir(tmp_path)
    # a study of its own: the module's may hold an explanation already
    fresh = tmp_path / "fresh.db"
    flags = [
        "--study",
        STUDY,
        "--storage",
        f"sqlite:///{fresh}",
        "--study-file",
        str(twin.study_file),
    ]
    done = cli("run", "--trials", "6", "--seed", "1", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    measure = explainer.Explainer._measure
    calls = 0

    def cut(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyboardInterrupt  # the machine taken back while the third run starts
        return measure(self, *args, **kwargs)

    monkeypatch.setattr(explainer.Explainer, "_measure", cut)
    tuner = Tuner(
        definition=load_study_definition(twin.study_file),
        study_name=STUDY,
        storage_url=f"sqlite:///{fresh}",
    )
    result, summary = tuner.explain(ExplainSettings(repeats=1, max_repeats=1))
    assert summary.interrupted and result is None  # nothing written at the end
    after = load(STUDY, fresh)
    state = load_state(after)
    assert state is not None and state.runs == 2 and not state.decisions
    found = load_explanation(after)
    assert found is not None, "two runs measured, no explanation stored"
    assert found.runs == 2 and not found.complete and found.stopped == "in progress"
    # round by round: the winner, then the baseline, each from a fresh start
    assert (found.winner_measured.n, found.baseline_measured.n) == (1, 1)
    assert found.winner_measured.mean is not None and found.baseline_measured.mean is not None
    # A study cut before this was so: its explanation removed, `--budget 0` writes it again
    # from the stored runs, measuring nothing.
    storage = after._storage
    storage.set_study_user_attr(after._study_id, RESULT_ATTR, None)
    assert load_explanation(load(STUDY, fresh)) is None
    runs_before = {
        k: v for k, v in load(STUDY, fresh).user_attrs.items() if k.startswith(RUN_PREFIX)
    }
    again = cli("explain", *flags, "--repeats", "1", "--max-repeats", "1", "--budget", "0",
                cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "explanation stopped: written from the runs stored (--budget 0)" in again.stdout
    written = load_explanation(load(STUDY, fresh))
    assert written is not None and written.runs == 2
    assert written.stopped == "written from the runs stored (--budget 0), nothing measured"
    assert [x.without for x in written.effects] == [x.without for x in found.effects]
    runs_after = {
        k: v for k, v in load(STUDY, fresh).user_attrs.items() if k.startswith(RUN_PREFIX)
    }
    assert runs_after == runs_before  # nothing measured
