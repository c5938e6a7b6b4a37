"""Which measurements of another study an explanation may borrow (``explain --runs-from``),
on a real SQLite study holding trials of every kind, and the check of the conditions they
were measured under."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from e2e_helpers import REPO
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.errors import ConfigError
from autotune.explain.borrowed import UNPLANNED, WINNER_LEFT, borrowable_runs, own_terms
from autotune.explain.changes import ChangeSet
from autotune.results import remeasure_key
from autotune.space import load_space
from autotune.study.definition import load_study_definition
from autotune.study.explainer import check_same_conditions
from autotune.trial.record import RemeasureRecord, TrialRecord

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
DEPLOYMENT = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
SERVICES = ("prefill", "decode", "router")
VERSION = {"prefill": "0.5.23", "decode": "0.5.23"}


@pytest.fixture(scope="module")
def space() -> Any:
    return load_space(SPACE)


def _config(space: Any, **changes: object) -> dict[str, Any]:
    return dict(space.complete({**space.baseline_params(), **changes}))


def _record(config: dict[str, Any], **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "config": config,
        "services": {s: {"command": f"run {s}"} for s in SERVICES},
        "restarted": list(SERVICES),
        "engine_version": VERSION,
        "metrics": {"output_throughput": 100.0},
    }
    return TrialRecord.model_validate({**base, **fields}).to_attrs()


def _add(study: optuna.Study, value: float, attrs: dict[str, Any], *, carried: bool = False) -> int:
    if carried:
        attrs = {**attrs, "warm_start_from": "old#3"}
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            values=[value],
            params={"x": 0.5},
            distributions={"x": FloatDistribution(0, 1)},
            user_attrs=attrs,
        )
    )
    return len(study.trials) - 1


def _remeasure(study: optuna.Study, of: int, repeat: int, value: float, **fields: Any) -> None:
    base: dict[str, Any] = {
        "of": of,
        "repeat": repeat,
        "values": [value],
        "feasible": True,
        "restarted": list(SERVICES),
        "metrics": {"output_throughput": value},
    }
    record = RemeasureRecord.model_validate({**base, **fields})
    study.set_user_attr(remeasure_key(of, repeat), record.to_attrs())


@pytest.fixture()
def check(tmp_path: Path, space: Any) -> optuna.Study:
    """A check study of every kind of trial: (value, what it is)."""
    study = optuna.create_study(
        study_name="chk", storage=f"sqlite:///{tmp_path / 'chk.db'}", direction="maximize"
    )
    base = _config(space)
    win = _config(space, sm120_flashmla_backend="flashinfer", sm120_direct_swa_kv=True)
    other = _config(space, pytorch_alloc_conf="expandable_segments:True")
    b = _add(study, 100.0, _record(base, is_baseline=True))  # borrowed
    _remeasure(study, b, 1, 101.0)  # borrowed
    _remeasure(study, b, 2, 0.0, failure="crash")  # failed
    w = _add(study, 200.0, _record(win))  # borrowed
    _remeasure(study, w, 1, 198.0)  # borrowed
    _remeasure(study, w, 2, 199.0, restarted=["router"])  # not fresh
    a = _add(study, 50.0, _record(other, aborted="clearly below"))  # aborted early
    _remeasure(study, a, 1, 150.0)  # borrowed: a full measurement of the configuration
    _add(study, 200.0, _record(win, reused_from=w))  # reused
    _add(study, 180.0, _record(win, restarted=["decode"]))  # not fresh
    _add(study, 0.0, _record(win, failure="oom", reason="x"))  # failed
    v = _add(study, 150.0, _record(win, engine_version={"prefill": "0.5.9", "decode": "0.5.9"}))
    _remeasure(study, v, 1, 151.0)  # another engine version, both
    _add(study, 300.0, _record(win), carried=True)  # carried by a warm start
    study.add_trial(
        create_trial(state=TrialState.FAIL, user_attrs=_record(win, failure="interrupted"))
    )  # not COMPLETE: never looked at
    return study


def test_only_full_fresh_measurements_of_the_same_engine_are_borrowed(
    check: optuna.Study, space: Any
) -> None:
    got = borrowable_runs(check, space=space, engine_version=VERSION)
    by_source = {r.source: r for r in got.runs}
    assert set(by_source) == {"chk#0", "chk#0/1", "chk#1", "chk#1/1", "chk#2/1"}
    assert [by_source[s].value for s in ("chk#0", "chk#0/1", "chk#1", "chk#1/1", "chk#2/1")] == [
        100.0,
        101.0,
        200.0,
        198.0,
        150.0,
    ]
    keys = {s: r.key for s, r in by_source.items()}
    assert keys["chk#0"] == keys["chk#0/1"] == space.config_key(_config(space))
    assert keys["chk#1"] == keys["chk#1/1"] != keys["chk#0"]
    assert keys["chk#2/1"] not in (keys["chk#0"], keys["chk#1"])
    assert all(r.feasible and r.failure is None and set(r.services) == set(SERVICES)
               for r in got.runs)  # fmt: skip
    assert by_source["chk#1/1"].metrics == {"output_throughput": 198.0}  # its own figures
    assert dict(got.skipped) == {
        "failed": 2,
        "not from freshly started services": 2,
        "aborted early": 1,
        "reused from an identical trial": 1,
        "another engine version": 2,
        "carried by a warm start": 1,
    }
    summary = got.summary()
    assert summary.startswith("5 measurement(s) of 3 configuration(s) from study 'chk'")
    assert "2 another engine version" in summary and "1 aborted early" in summary


def test_without_a_winner_version_every_version_is_borrowed(
    check: optuna.Study, space: Any
) -> None:
    got = borrowable_runs(check, space=space, engine_version={})
    assert {"chk#6", "chk#6/1"} <= {r.source for r in got.runs}
    assert "another engine version" not in got.skipped


def test_runs_under_other_inherited_variables_are_not_borrowed(tmp_path: Path, space: Any) -> None:
    """The winner's services inherited VLLM_WORKER_MULTIPROC_METHOD=fork: a check run that
    spawned is another environment; one that did not record it (older schema) is not judged."""
    study = optuna.create_study(
        study_name="env", storage=f"sqlite:///{tmp_path / 'env.db'}", direction="maximize"
    )
    win = _config(space, sm120_flashmla_backend="flashinfer", sm120_direct_swa_kv=True)

    def services(env: dict[str, str] | None) -> dict[str, Any]:
        return {s: {"command": f"run {s}", "inherited_env": env} for s in SERVICES}

    forked = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    _add(study, 200.0, _record(win, services=services(forked)))  # borrowed
    _add(study, 170.0, _record(win, services=services({})))  # spawned: not borrowed
    old = _add(study, 190.0, _record(win, services=services(None)))  # not recorded: borrowed
    # #2 predates the recording; its re-measurements since recorded theirs: 1 forked, 2 not.
    for repeat, env in ((1, forked), (2, {})):
        again = RemeasureRecord(
            of=old,
            repeat=repeat,
            values=[195.0],
            feasible=True,
            metrics={"output_throughput": 195.0},
            restarted=list(SERVICES),
            inherited_env=dict.fromkeys(SERVICES, env),
        )
        study.set_user_attr(remeasure_key(old, repeat), again.to_attrs())
    winner = dict.fromkeys(SERVICES, forked)
    got = borrowable_runs(study, space=space, engine_version=VERSION, inherited=winner)
    assert {r.source for r in got.runs} == {"env#0", "env#2", "env#2/1"}
    assert dict(got.skipped) == {"another inherited environment": 2}
    every = borrowable_runs(study, space=space, engine_version=VERSION)
    assert len(every.runs) == 5  # the winner's inheritance unknown: no judgement


def test_the_study_itself_lends_no_run_of_the_winner_and_at_most_repeats_less_one(
    tmp_path: Path, space: Any
) -> None:
    """``--own-runs``: the winner's configuration is left whole (its trials and their
    re-measurements, under any trial number), and so is a configuration the explanation
    never measures (not the baseline with some of the winner's changes); another lends its
    earliest runs (measured order, not its figures), up to ``repeats - 1`` counting the runs
    the explanation already holds of it from elsewhere."""
    study = optuna.create_study(
        study_name="own", storage=f"sqlite:///{tmp_path / 'own.db'}", direction="maximize"
    )
    alloc = {"pytorch_alloc_conf": "expandable_segments:True"}
    flash = {"sm120_flashmla_backend": "flashinfer", "sm120_direct_swa_kv": True}
    win = _config(space, **flash, **alloc)
    revert = _config(space, **flash)  # the winner without the allocator change
    other = _config(space, **alloc)  # the winner without the attention change
    unplanned = _config(space, **alloc, cuda_graph_max_bs_decode=32)
    r = _add(study, 90.0, _record(revert))  # earliest of the revert: borrowed
    w = _add(study, 200.0, _record(win))
    _remeasure(study, w, 1, 190.0)  # the winner's re-measurement: left
    _remeasure(study, r, 1, 95.0)  # the revert's second run
    _add(study, 99.0, _record(revert))  # the revert's third run, its highest
    _add(study, 205.0, _record(win))  # the winner's configuration under another number
    o = _add(study, 120.0, _record(other))
    _add(study, 130.0, _record(unplanned))
    changes = ChangeSet(space, baseline=space.baseline_params(), winner=win)
    assert len(changes.changes) == 2
    leave, per_config = own_terms(changes, repeats=3)
    assert per_config == 2

    got = borrowable_runs(
        study, space=space, engine_version=VERSION, leave=leave, per_config=per_config
    )
    assert [r_.source for r_ in got.runs] == ["own#0", "own#0/1", f"own#{o}"]
    beyond = "beyond repeats - 1 runs of a configuration (one is the explanation's own)"
    assert dict(got.skipped) == {WINNER_LEFT: 3, beyond: 1, UNPLANNED: 1}

    held = {space.config_key(other): 2, space.config_key(revert): 1}
    got = borrowable_runs(
        study, space=space, engine_version=VERSION, leave=leave, per_config=per_config,
        held=held,
    )  # fmt: skip
    assert [r_.source for r_ in got.runs] == ["own#0"]
    assert got.skipped[beyond] == 3

    _, none = own_terms(changes, repeats=1)
    got = borrowable_runs(study, space=space, engine_version=VERSION, leave=leave, per_config=none)
    assert got.runs == [] and got.skipped[beyond] == 4


def _study_file(path: Path, name: str, *, load: str = "concurrency: 4", space: Path = SPACE) -> Any:
    path.write_text(
        f"name: {name}\nspace: {space}\ndeployment: {DEPLOYMENT}\nobjective: throughput\n"
        f"load:\n  {load}\n  input_len: 64\n  output_len: 6\n  requests: 4\n"
        f"remeasure: {{budget: 0}}\n"
    )
    return load_study_definition(path)


def test_the_conditions_are_the_files_contents_and_the_measuring_fields(tmp_path: Path) -> None:
    this = _study_file(tmp_path / "a.yaml", "a")
    # the same space under another path, another remeasure/enqueue: the same conditions
    copy = tmp_path / "space-copy.yaml"
    copy.write_bytes(SPACE.read_bytes())
    same = _study_file(tmp_path / "b.yaml", "b", space=copy)
    check_same_conditions(this, same)

    other_load = _study_file(tmp_path / "c.yaml", "c", load="concurrency: 8")
    with pytest.raises(ConfigError) as caught:
        check_same_conditions(this, other_load)
    assert caught.value.field == "load" and caught.value.file == str(tmp_path / "c.yaml")
    assert "'c' was measured under another load than study 'a'" in str(caught.value)

    edited = tmp_path / "space-edited.yaml"
    edited.write_text(SPACE.read_text() + "\n# edited\n")
    other_space = _study_file(tmp_path / "d.yaml", "d", space=edited)
    with pytest.raises(ConfigError) as caught:
        check_same_conditions(this, other_space)
    assert caught.value.field == "space" and "the files differ" in caught.value.message
