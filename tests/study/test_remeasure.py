"""Early abort and re-measurement in the real loop: simulated servers on loopback, SQLite.

An early-aborted trial is COMPLETE with its partial estimate, marked ``aborted`` and never
the winner unless re-measured; re-measurements are study attributes (trial counts, the
reuse index and the sampler never see them), each from freshly started services, and an
interrupted or killed re-measure phase resumes where it stopped.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
from e2e_helpers import FAST_CONFIG, REPO
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from reliability_support import (  # noqa: E402
    alive,
    assert_consistent,
    db_path,
    kill_all,
    processes_with_marker,
    run_cli,
    service_pids,
)

from autotune.results import (
    best_estimate,
    best_trial,
    config_estimates,
    load_remeasurements,
    remeasure_candidates,
    remeasure_key,
)
from autotune.space import load_space
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner

pytestmark = pytest.mark.slow

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"


def _study_file(tmp_path: Path, *, extra: str, load: str = "", name: str = "s.yaml") -> Path:
    """A tiny load (C=4, 64 in / 6 out) on the bundled simulated deployment."""
    path = tmp_path / name
    path.write_text(
        f"name: rm\nspace: {SPACE}\n"
        f"deployment: {REPO / 'launchers' / 'sim-dsv4-flash-pd.yaml'}\n"
        "load:\n  concurrency: 4\n  input_len: 64\n  output_len: 6\n  warmup_requests: 4\n"
        "  requests: 8\n  max_duration_s: 30\n  request_timeout_s: 30\n"
        + load
        + "correctness:\n  max_tokens: 3\n"
        + extra
    )
    return path


def _params(**changes: Any) -> dict[str, Any]:
    names = {p.name for p in load_space(SPACE).sampled_params}
    return {k: v for k, v in {**FAST_CONFIG, **changes}.items() if k in names}


def test_aborted_trial_is_stored_marked_and_never_wins_and_the_close_ones_are_raced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    study_file = _study_file(
        tmp_path,
        extra="  target_rel_ci: 0.1\nearly_abort: {abort_below: 0.5}\n"
        "remeasure: {policy: race, budget: 3}\n",
    )
    # target_rel_ci in the load section (it was appended after correctness: move it)
    text = study_file.read_text().replace("  target_rel_ci: 0.1\n", "")
    study_file.write_text(text.replace("  requests: 8\n", "  requests: 8\n  target_rel_ci: 0.1\n"))
    tuner = Tuner(
        definition=load_study_definition(study_file),
        study_name="rm",
        storage_url=f"sqlite:///{tmp_path / 'rm.db'}",
        seed=1,
    )
    fast = _params()
    same_speed = _params(pytorch_alloc_conf="expandable_segments:True")  # memory only
    slow = _params(sm120_flashmla_backend="triton")  # ~16% of fast in the model: clearly below
    for params in (fast, same_speed, slow):
        tuner.study.enqueue_trial(params)
    tuner._enqueue_baseline = lambda: None  # type: ignore[method-assign]
    summary = tuner.run(n_trials=3)
    # 1 restart is enough when the leader's two runs agree so closely that the other is
    # within the 1% indifference zone ("either is fine", asserted below): less likely the
    # noisier the runs; a clean-clone run drew it.
    assert summary.trials_total == 3 and summary.remeasured in (1, 2, 3)

    trials = tuner.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    first, second, aborted = trials
    assert aborted.user_attrs["aborted"] and "incumbent #" in aborted.user_attrs["aborted"]
    assert aborted.user_attrs["failure"] is None
    assert aborted.constraints["feasible"] == 0.0  # feasible: a partial estimate, not a fault
    assert 0 < aborted.values[0] < 0.5 * first.values[0]
    assert aborted.user_attrs["metrics"]["completed"] > 0
    for t in (first, second):
        assert not t.user_attrs.get("aborted")
        assert set(t.user_attrs["phase_seconds"]) >= {
            "restart", "probe", "warmup", "measure", "tuner", "total"
        }  # fmt: skip
    assert aborted.user_attrs["phase_seconds"]["measure"] < 30  # cut short, not capped

    # The race is between the two that qualify (the aborted trial does not), as fast as
    # each other: the leader first, then the other (now the wider interval), then the
    # leader again, since two same-speed configurations are almost never told apart in 2
    # restarts; each from fresh processes, stored as study attributes: no trial was added.
    records = load_remeasurements(tuner.study)
    pairs = {(m.of, m.repeat) for m in records}
    assert pairs <= {(0, 1), (1, 1), (0, 2), (1, 2)} and len(pairs) == summary.remeasured
    for m in records:
        assert m.full and m.throughput and m.metrics["completed"] > 0 and m.target == 3
        raw = tuner.study.user_attrs[remeasure_key(m.of, m.repeat)]
        assert sorted(raw["restarted"]) == ["decode", "prefill", "router"]
        # its fresh starts' stages, as a trial's (the simulated workers print SGLang's)
        assert set(m.startup) == {"decode", "prefill", "router"}
        assert m.startup["decode"].stages and m.startup["decode"].ready_s is not None
    decision = tuner.remeasurer.decision
    assert decision is not None and decision.stop
    assert len(records) == 3 or "separated" in decision.reason or "fine" in decision.reason
    best = best_estimate(tuner.study)
    assert best is not None and best.trial.number == decision.leader  # what the race decided
    assert best.trial.number in (0, 1) and best.n >= 1
    assert best.half_width is not None and best.noise_df == len(records)

    # Nothing left to do: the same target neither runs trials nor re-measures again.
    again = tuner.run(n_trials=3)
    assert again.trials_run == 0 and again.remeasured == 0
    assert len(tuner.study.get_trials()) == 3

    # "Never wins unless re-measured": a (made-up) great re-measurement makes it eligible.
    tuner.study.set_user_attr(
        remeasure_key(2, 1),
        {
            "of": 2,
            "repeat": 1,
            "feasible": True,
            "metrics": {"output_throughput": 10 * first.values[0]},
        },
    )
    estimates = {e.trial.number: e for e in config_estimates(tuner.study)}
    assert estimates[2].n == 1  # the aborted partial run is not counted
    chosen = best_trial(tuner.study)
    assert chosen is not None and chosen.number == 2


def test_interrupted_and_killed_re_measure_phase_resumes(tmp_path: Path) -> None:
    """Ctrl-C while re-measuring stores nothing; kill -9 after the journal write is recorded
    from the journal by the next run; the phase then finishes what is missing."""
    off = _study_file(tmp_path, extra="remeasure: {top_k: 0}\n", name="off.yaml")
    on = _study_file(
        tmp_path, extra="remeasure: {policy: fixed, top_k: 2, repeats: 1}\n", name="on.yaml"
    )
    marker = uuid.uuid4().hex
    env = {"AUTOTUNE_TEST_MARKER": marker}
    db = db_path(tmp_path)
    runs = tmp_path / "studies" / "runs"
    orphans: dict[str, int] = {}
    try:
        first = run_cli(tmp_path, "--trials", "2", "--seed", "3", study_file=off, extra_env=env)
        assert first.returncode == 0, first.stderr
        assert not load_remeasurements_of(db)

        cut = run_cli(
            tmp_path, "--trials", "2", study_file=on, failpoints="measure=sigint", extra_env=env
        )
        assert cut.returncode == 130, cut.stderr
        err = " ".join(cut.stderr.split())
        assert "the re-measurement cut short stored nothing" in err
        assert "Resume with the same command" in err
        assert not processes_with_marker(marker)
        trials = assert_consistent(db)
        assert len(trials) == 2 and not load_remeasurements_of(db)

        killed = run_cli(
            tmp_path, "--trials", "2", study_file=on, failpoints="journal.saved=kill", extra_env=env
        )
        assert killed.returncode == -9, killed.stderr
        orphans = service_pids(runs)
        assert list(runs.rglob("journal/*.json"))
        assert not load_remeasurements_of(db)

        resumed = run_cli(tmp_path, "--trials", "2", study_file=on, extra_env=env)
        assert resumed.returncode == 0, resumed.stderr
        assert "recorded now from the journal" in resumed.stdout + resumed.stderr
    finally:
        kill_all({n: p for n, p in orphans.items() if alive(p)})
        kill_all({str(p): p for p in processes_with_marker(marker)})
    trials = assert_consistent(db)
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    study = optuna.load_study(study_name="rel", storage=f"sqlite:///{db}")
    top = {(e.trial.number, 1) for e in remeasure_candidates(study, 2)}
    assert (0, 1) in top  # the baseline at least (the sampled trial may have crashed)
    assert set(load_remeasurements_of(db)) == top
    assert not list(runs.rglob("journal/*.json")), "journal entries left behind"
    assert not any(alive(pid) for pid in orphans.values())
    assert not processes_with_marker(marker)


def load_remeasurements_of(db: Path) -> list[tuple[int, int]]:
    study = optuna.load_study(study_name="rel", storage=f"sqlite:///{db}")
    return [(m.of, m.repeat) for m in load_remeasurements(study)]
