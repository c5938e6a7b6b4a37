"""scripts/h200/side_by_side.py: every check study it fills has a hand-picked configuration
that its space accepts, and it queues baseline, hand-picked and winner in that order.

benchmarks/h200_side_by_side.py: BENCHMARKS.md's side-by-side table from the stored studies (the
dense study's 20 restarts and its winner #21, the random arm in progress, the complete sweep,
the check study's defaults, hand-picked and winner from fresh starts, and the winner measured
by both clients), and, built here, a sweep's tarball cut part-way as scripts/h200/run.sh's
collect writes it and a check study's three configurations, each measured three times."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna
import pytest

from autotune.explain import (
    ChangeSet,
    Decide,
    ExplainRun,
    ExplainSettings,
    Finished,
    Planner,
    load_runs,
)
from autotune.explain.borrowed import borrowable_runs, own_terms
from autotune.space import load_space
from autotune.study.definition import load_study_definition
from autotune.trial.record import TrialRecord

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "side_by_side", ROOT / "scripts" / "h200" / "side_by_side.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HAND_PICKED: dict[str, dict[str, object]] = _script().HAND_PICKED


@pytest.mark.parametrize("study", sorted(HAND_PICKED))
def test_the_hand_picked_configuration_is_one_of_the_space(study: str) -> None:
    path = ROOT / "studies" / f"{study}.yaml"
    definition = load_study_definition(path)
    assert definition.early_abort is None  # a check study measures everything it queues
    space = load_space(path.parent / definition.space)
    params = {**space.baseline_params(), **HAND_PICKED[study]}
    config = space.complete(params)
    assert not space.violations(config)
    changed = {k for k, v in params.items() if v != space.baseline_params().get(k)}
    assert changed == set(HAND_PICKED[study]) - {
        k for k, v in HAND_PICKED[study].items() if v == space.baseline_params().get(k)
    }
    assert changed, "the hand-picked configuration is the baseline"


def _queue(storage: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "h200" / "side_by_side.py"),
            "--study",
            "vllm-h200-dense-check",
            "--winner-study",
            "vllm-h200-dense",
            "--winner-from",
            f"sqlite:///{ROOT / 'benchmarks' / 'h200' / 'vllm-h200-dense.db'}",
            "--storage",
            storage,
            *extra,
        ],
        capture_output=True,
        text=True,
    )


def test_the_dense_check_study_is_queued_from_the_stored_h200_study(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'check.db'}"
    done = _queue(storage)
    assert done.returncode == 0, done.stderr
    assert "queued winner #21" in done.stdout, done.stdout
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    queued = optuna.load_study(study_name="vllm-h200-dense-check", storage=storage).trials
    assert [t.user_attrs.get("is_baseline", t.user_attrs.get("label")) for t in queued] == [
        True,
        "hand-picked",
        "winner #21",
    ]
    hand, winner = (t.system_attrs["fixed_params"] for t in queued[1:])  # waiting: not run yet
    assert hand["quantization"] == winner["quantization"] == "fp8"
    assert hand["kv_cache_dtype"] == "fp8" and hand["max_num_batched_tokens"] == 16384
    assert winner["enable_prefix_caching"] == "off" and winner["cudagraph_mode"] == "FULL"


CHECK_H100 = ROOT / "benchmarks" / "h100" / "vllm-dense-check-h100.db"
"""The dense check study measured on an H100: defaults, hand-picked and #21, nothing queued
with ``--also``."""


def test_also_queues_one_more_trial_into_the_measured_check_study(tmp_path: Path) -> None:
    """#19 of the dense study was cut by a faulty early abort: `--also 19` queues its
    configuration into the check study that already holds its measured trials, once. (The
    H100's copy of the check study: the H200's holds #19 since 2026-12-07.)"""
    db = tmp_path / "check.db"
    shutil.copyfile(CHECK_H100, db)
    db.chmod(0o644)
    storage = f"sqlite:///{db}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    before = len(optuna.load_study(study_name="vllm-h200-dense-check", storage=storage).trials)

    refused = _queue(storage)  # without --also, a study with trials is left alone
    assert refused.returncode != 0 and "already has trials" in refused.stderr

    first = _queue(storage, "--also", "19")
    assert first.returncode == 0 and "queued #19 of vllm-h200-dense" in first.stdout, first
    again = _queue(storage, "--also", "19")
    assert again.returncode == 0 and "already in" in again.stdout, again
    trials = optuna.load_study(study_name="vllm-h200-dense-check", storage=storage).trials
    assert len(trials) == before + 1
    queued = trials[-1]
    assert queued.state == optuna.trial.TrialState.WAITING
    assert queued.user_attrs["label"] == "#19 of vllm-h200-dense"
    tuned = optuna.load_study(
        study_name="vllm-h200-dense",
        storage=f"sqlite:///{ROOT / 'benchmarks' / 'h200' / 'vllm-h200-dense.db'}",
    )
    assert queued.system_attrs["fixed_params"] == tuned.trials[19].params

    missing = _queue(storage, "--also", "999")
    assert missing.returncode != 0 and "no trial 999" in missing.stderr
    for bad, says in (("vllm-h200-nothing:best", "no study database"), ("x:y", "expected N")):
        refused = _queue(storage, "--also", bad)
        assert refused.returncode != 0 and says in refused.stderr, refused


def test_also_queues_another_arms_winner_by_its_own_estimate(tmp_path: Path) -> None:
    """The random-search arm's winner goes into the same check study, to be measured from
    fresh starts beside the others: `--also STUDY:best` takes it by the estimate `best` uses,
    labelled with its own study's trial number."""
    db = tmp_path / "check.db"
    shutil.copyfile(CHECK_H100, db)
    db.chmod(0o644)
    storage = f"sqlite:///{db}"
    random_db = ROOT / "benchmarks" / "h200" / "vllm-h200-dense-random.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    arm = optuna.load_study(study_name="vllm-h200-dense-random", storage=f"sqlite:///{random_db}")
    from autotune.results import best_estimate

    best = best_estimate(arm)
    assert best is not None
    done = _queue(storage, "--also", "vllm-h200-dense-random:best", "--also", "19")
    assert done.returncode == 0, done.stderr
    name = f"#{best.trial.number} of vllm-h200-dense-random"
    assert f"queued {name}" in done.stdout and "queued #19 of vllm-h200-dense:" in done.stdout
    trials = optuna.load_study(study_name="vllm-h200-dense-check", storage=storage).trials
    assert [t.user_attrs["label"] for t in trials[-2:]] == [name, "#19 of vllm-h200-dense"]
    assert trials[-2].system_attrs["fixed_params"] == arm.trials[best.trial.number].params
    again = _queue(storage, "--also", f"vllm-h200-dense-random:{best.trial.number}")
    assert again.returncode == 0 and f"{name}: already in" in again.stdout, again


def test_the_h200_check_study_holds_both_configurations_queued_with_also(tmp_path: Path) -> None:
    """The H200 session of 2026-12-07 ran `ALSO="vllm-h200-dense-random:best 19"`: both are in
    the stored check study, measured, and asking again queues nothing."""
    db = tmp_path / "check.db"
    shutil.copyfile(ROOT / "benchmarks" / "h200" / "vllm-h200-dense-check.db", db)
    db.chmod(0o644)
    storage = f"sqlite:///{db}"
    done = _queue(storage, "--also", "vllm-h200-dense-random:best", "--also", "19")
    assert done.returncode == 0, done.stderr
    assert "#19 of vllm-h200-dense-random: already in" in done.stdout, done.stdout
    assert "#19 of vllm-h200-dense: already in" in done.stdout, done.stdout
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="vllm-h200-dense-check", storage=storage).trials
    labels = [t.user_attrs.get("label") for t in trials]
    assert labels[-2:] == ["#19 of vllm-h200-dense-random", "#19 of vllm-h200-dense"]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials[-2:])


# ------------------------------------------------------------------------ the reader

H200 = ROOT / "benchmarks" / "h200"
DENSE = "vllm-h200-dense"


def _reader() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "h200_side_by_side", ROOT / "benchmarks" / "h200_side_by_side.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _row(lines: list[str], arm: str) -> list[str]:
    row = next(line for line in lines if line.startswith(f"| {arm}"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_the_reader_on_the_stored_h200_studies() -> None:
    lines = _reader().report(DENSE, 20)
    assert "against the check study's defaults, 3 fresh starts, 4,403.8 tok/s" in lines[2]
    tpe = _row(lines, "autotune, TPE")
    assert tpe[1] == "20 (18 trials + 2 re-measured)"
    assert tpe[2].startswith("#21: cudagraph_mode=FULL") and "quantization=fp8" in tpe[2]
    assert tpe[3] == "5,757.4 (n=2: 5,821.8, 5,693.0)"
    assert tpe[4] == "0.111 (n=2)"
    assert tpe[5].startswith("+30.7% (95% CI")
    random = _row(lines, "random search")
    # complete at the TPE arm's budget (2026-12-07): its last 6 launches ran on two H100s
    # when no H200 came, which the cell says (trial #6, cut by a machine's end, recorded no GPU)
    assert random[1] == "20 (18 trials + 2 re-measured); on H200 (13), H100 80GB HBM3 (6)"
    assert random[2].startswith("#19: block_size=32, cudagraph_mode=FULL")
    assert random[3] == "5,817.3 (n=2: 5,833.6, 5,801.1)"
    defaults = _row(lines, "vLLM defaults, 3")
    assert defaults[3] == "4,403.8 (n=3: 4,226.1, 4,483.0, 4,502.4)"
    hand = _row(lines, "hand-picked")
    assert hand[1] == "5" and hand[3] == (
        "5,568.0 (n=5: 5,211.2, 5,815.6, 5,846.6, 5,578.0, 5,388.6)"
    )
    # The winner's first run was cut when the machine went back; its retry (#3) carried no
    # label then and is found through the trial it retried. Its last two runs, and the
    # hand-picked's, came from the third H200 (2026-12-07), beside random search's winner.
    winner = _row(lines, "winner re-measured (winner #21)")
    assert winner[1] == "5" and winner[3] == (
        "5,810.3 (n=5: 5,722.6, 5,677.7, 5,911.4, 5,814.5, 5,925.5)"
    )
    assert winner[5].startswith("+31.9% (95% CI +24.6")
    # random search's winner and the TPE study's #19, from fresh starts in the check study
    rnd = _row(lines, "#19 of vllm-h200-dense-random, from fresh starts")
    assert rnd[1] == "5" and rnd[3] == (
        "5,680.4 (n=5: 5,560.2, 5,683.2, 5,606.2, 5,762.0, 5,790.4)"
    )
    assert rnd[2].startswith("block_size=32, cudagraph_mode=FULL,")
    tpe19 = _row(lines, "#19 of vllm-h200-dense, from fresh starts")
    assert tpe19[1] == "1" and tpe19[3] == "5,473.0 (n=1: 5,473.0)"
    # The sweep is complete (2026-12-05): 20 combinations x 3 runs, 24 restarts (the
    # combinations a session's end cut were started again in the next), over 4 device
    # sessions (runs more than 20 minutes apart).
    sweep = _row(lines, "`vllm bench sweep serve`")
    assert sweep[1] == "24 (20 of 20 combinations done; in 4 sittings)"
    assert sweep[2] == "max_num_seqs=256, max_num_batched_tokens=2048"
    assert sweep[3] == "4,411.9 (n=3: 4,401.4, 4,416.4, 4,417.8) by `vllm bench serve`"
    # the grid's best is at the defaults' level: the levers the sweep varies buy nothing here
    assert sweep[5].startswith("+1.6% (95% CI +0.3 to +3.0%) over its own 1024 x 8192 point")
    # autotune's winner on one fresh start, both clients alternating: they agree within 1%.
    agreement = _row(lines, "winner, one fresh start")
    assert agreement[3] == (
        "5,925.3 (n=3: 5,858.3, 5,944.5, 5,973.1) vs 5,960.1 (n=3: 6,009.3, 5,914.1, 5,956.9)"
    )
    assert agreement[5] == "vllm bench serve -0.6% vs autotune's client"
    # The check study spans three H200s: the defaults' and the hand-picked's first runs on
    # the one whose session ended (its winner run was cut), the next six on another, the
    # rest on a third. On the GPU that measured most of both, the winner is level with the
    # hand-picked; against random search's winner from fresh starts it is ahead by 3% with an
    # interval that still reaches below zero.
    start = lines.index("The winner re-measured (winner #21) against each arm:") + 1
    assert lines[start] == (
        "* vLLM's defaults (3 fresh starts): +31.9% (95% CI +24.6 to +39.3%); not all side by "
        "side (on 3 GPUs); on GPU-2acac915 alone (n=3 vs 2): +28.4% (95% CI +21.5 to +35.4%); "
        "the GPU as a block: +28.4% (95% CI +23.1 to +33.9%; 8 runs on 3 GPUs, 4 df)"
    )
    assert lines[start + 1] == (
        "* the hand-picked combination: +4.4% (95% CI -1.7 to +10.4%); not all side by side "
        "(on 3 GPUs); on GPU-2acac915 alone (n=3 vs 2): -1.0% (95% CI -6.4 to +4.4%); the GPU "
        "as a block: +2.6% (95% CI -2.3 to +7.6%; 10 runs on 3 GPUs, 6 df)"
    )
    assert lines[start + 2].startswith("* random search's best (#19: block_size=32,")
    assert lines[start + 2].endswith(
        "from fresh starts in the check study: +2.3% (95% CI -0.5 to +5.0%); not all side by "
        "side (on 2 GPUs); on GPU-8eeae43e alone (n=2 vs 5): +3.3% (95% CI -2.0 to +8.7%); the "
        "GPU as a block: +3.3% (95% CI -0.3 to +7.1%; 10 runs on 2 GPUs, 7 df)"
    )


def test_same_gpu_says_where_two_rows_ran() -> None:
    reader = _reader()
    a, b = "GPU-aaaaaaaa-1111", "GPU-bbbbbbbb-2222"

    def row(values: list[float], gpus: list[str | None]) -> Any:
        return reader.Row("arm", values=values, gpus=gpus)

    assert reader.same_gpu(row([10.0, 11.0], [a, a]), row([5.0], [a])) == (
        "side by side, one session"
    )
    # without a recorded GPU (a CPU, an older study): taken as one session's
    assert reader.same_gpu(row([10.0], [None]), row([5.0], [a])) == "side by side, one session"
    assert reader.same_gpu(row([10.0], [a]), row([5.0], [b])) == (
        "not side by side (no GPU measured both)"
    )
    mixed = reader.same_gpu(row([10.0, 10.4, 9.6], [b, b, b]), row([5.0, 4.0, 5.2], [a, b, b]))
    assert mixed.startswith("not all side by side (on 2 GPUs); on GPU-bbbbbbbb alone (n=3 vs 2)")
    assert f"alone (n=3 vs 2): {reader.gain([10.0, 10.4, 9.6], [4.0, 5.2])}; " in mixed
    # every run, the GPU as a block (tests/benchmarks/test_gpu_gain.py checks the fit)
    assert mixed.endswith("as a block: +119.1% (95% CI +58.3 to +203.4%; 6 runs on 2 GPUs, 3 df)")


def _sweep_tar(root: Path) -> Path:
    """scripts/h200/run.sh collect's tarball of the side-by-side directory: a sweep cut after
    3 of its 20 combinations (3 runs each), vLLM 0.26.0's layout."""
    side = root / "side"
    sweep = side / "sweep"
    grid = [
        {"max_num_seqs": s, "max_num_batched_tokens": t}
        for s in (64, 128, 256, 512, 1024)
        for t in (2048, 4096, 8192, 16384)
    ]
    done = {(256, 4096): (6000.0, 6100.0, 5900.0), (1024, 8192): (4500.0, 4400.0, 4600.0),
            (64, 2048): (3000.0, 3100.0, 2900.0)}  # fmt: skip
    log = []
    for (seqs, tokens), values in done.items():
        combo = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}
        d = (
            sweep
            / "results"
            / "grid"
            / f"SERVE--max_num_seqs={seqs}-max_num_batched_tokens={tokens}"
        )
        d.mkdir(parents=True)
        runs = []
        for n, value in enumerate(values):
            runs.append({"output_throughput": value, "completed": 384, "run_number": n, **combo})
            (d / f"run={n}.json").write_text(json.dumps(runs[-1]))
        (d / "summary.json").write_text(json.dumps(runs))
        log += ["[BEGIN SERVER]", f"Server overrides: {combo}", "[END SERVER]"]
    (sweep / "serve-params.json").write_text(json.dumps(grid))
    (sweep / "options.json").write_text(json.dumps({"budget": 20, "num_runs": 3}))
    (sweep / "sweep.log").write_text("\n".join(log) + "\n")
    tar = root / f"{DENSE}-side-by-side.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        t.add(side, arcname=".")
    return tar


def _check_db(path: Path) -> None:
    """A check study as `scripts/h200/run.sh check` leaves it: the baseline, the hand-picked
    configuration (here #13's) and the winner (#21), each measured once as a trial and twice
    more from fresh starts."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dense = optuna.load_study(study_name=DENSE, storage=f"sqlite:///{H200 / DENSE}.db")
    check = optuna.create_study(
        study_name=f"{DENSE}-check", storage=f"sqlite:///{path}", direction="maximize"
    )
    template = dense.user_attrs["remeasure:21:1"]
    for number, (source, label, values) in enumerate(
        [(0, None, (4300.0, 4350.0, 4250.0)), (13, "hand-picked", (5500.0, 5550.0, 5450.0)),
         (21, "winner #21", (5800.0, 5750.0, 5850.0))]
    ):  # fmt: skip
        src = dense.trials[source]
        attrs: dict[str, Any] = dict(src.user_attrs)
        if label:
            attrs["label"] = label
        check.add_trial(
            optuna.trial.create_trial(
                params=src.params, distributions=src.distributions, value=values[0],
                user_attrs=attrs, system_attrs={"constraints": [0.0, 0.0]},
            )
        )  # fmt: skip
        for repeat, value in enumerate(values[1:], start=1):
            record = copy.deepcopy(template)
            record.update(of=number, repeat=repeat, values=[value])
            record["telemetry"]["energy_per_token_j"] = 0.1 + number / 100 + repeat / 1000
            check.set_user_attr(f"remeasure:{number}:{repeat}", record)


def test_the_reader_with_the_sweep_and_the_check_study_stored(tmp_path: Path) -> None:
    for name in (DENSE, f"{DENSE}-random"):
        shutil.copy(H200 / f"{name}.db", tmp_path / f"{name}.db")
    _sweep_tar(tmp_path)
    _check_db(tmp_path / f"{DENSE}-check.db")
    lines = _reader().report(DENSE, 20, here=tmp_path)
    assert "against the check study's defaults, 3 fresh starts, 4,300.0 tok/s" in lines[2]
    sweep = _row(lines, "`vllm bench sweep serve`")
    assert sweep[1] == "3 (3 of 20 combinations done)"
    assert sweep[2] == "max_num_seqs=256, max_num_batched_tokens=4096"
    assert sweep[3].startswith("6,000.0 (n=3: 6,000.0, 6,100.0, 5,900.0)")
    assert sweep[5].startswith("+33.3% (95% CI") and "over its own 1024 x 8192 point" in sweep[5]
    defaults = _row(lines, "vLLM defaults, 3 fresh starts")
    assert defaults[1] == "3" and defaults[2] == "vLLM's defaults"
    assert defaults[3] == "4,300.0 (n=3: 4,300.0, 4,350.0, 4,250.0)"
    assert defaults[4].startswith("0.1") and defaults[4].endswith("(n=3)")
    hand = _row(lines, "hand-picked")
    assert "quantization=fp8" in hand[2] and hand[5].startswith("+27.9% (95% CI")
    winner = _row(lines, "winner re-measured (winner #21)")
    assert winner[1] == "3" and winner[3].startswith("5,800.0 (n=3")
    assert winner[5].startswith("+34.9% (95% CI +")
    # the tuning arms are now compared with the check study's defaults
    assert _row(lines, "autotune, TPE")[5].startswith("+33.9%")
    # No agreement run in this tarball: the sweep's best is set against autotune's figure of
    # the winner (5,800 against 6,000), and the verdict says the clients differ.
    verdict = lines[lines.index("The winner re-measured (winner #21) against each arm:") + 1 :]
    assert verdict[1].startswith("* the hand-picked combination: +5.5% (95% CI")
    assert verdict[3].startswith(
        "* the sweep's best (max_num_seqs=256, max_num_batched_tokens=4096): -3.3% (95% CI"
    )
    assert verdict[3].endswith("; autotune's client against `vllm bench serve`, not side by side")


def test_no_verdict_before_the_check_study_measured_the_winner(tmp_path: Path) -> None:
    for name in (DENSE, f"{DENSE}-random"):
        shutil.copy(H200 / f"{name}.db", tmp_path / f"{name}.db")
    lines = _reader().report(DENSE, 20, here=tmp_path)
    assert "the tuning studies' baselines" in lines[2]
    assert _row(lines, "winner re-measured")[3] == "not run yet"
    assert lines[-1].startswith("| winner, one fresh start")  # the table ends the report
    assert not any("against each arm" in line for line in lines)


def test_the_reader_gives_a_row_to_a_configuration_queued_with_also(tmp_path: Path) -> None:
    """The check study's fourth configuration (`side_by_side.py --also 19`) gets its own row,
    compared with the defaults like the others. Here a copy of the hand-picked run stands in
    for its measurement, under #19's name."""
    for src in H200.glob(f"{DENSE}*"):
        shutil.copyfile(src, tmp_path / src.name)
        (tmp_path / src.name).chmod(0o644)
    # the H100's check study: the H200's holds #19 measured since 2026-12-07
    shutil.copyfile(CHECK_H100, tmp_path / f"{DENSE}-check.db")
    storage = f"sqlite:///{tmp_path / f'{DENSE}-check.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check = optuna.load_study(study_name=f"{DENSE}-check", storage=storage)
    hand = check.trials[1]
    check.add_trial(
        optuna.trial.create_trial(
            params=hand.params,
            distributions=hand.distributions,
            values=hand.values,
            user_attrs={**hand.user_attrs, "label": "#19 of vllm-h200-dense"},
            system_attrs=hand.system_attrs,
        )
    )
    lines = _reader().report(DENSE, 20, here=tmp_path)
    extra = _row(lines, "#19 of vllm-h200-dense, from fresh starts")
    assert extra[1] == "1" and extra[3] == "5,043.0 (n=1: 5,043.0)", extra
    assert "quantization=fp8" in extra[2]
    assert extra[5].startswith("+29.7%"), extra  # 5,043.0 against the defaults' 3,887.1
    # the rows that were there are unchanged
    assert _row(lines, "hand-picked")[3] == "5,188.6 (n=3: 5,043.0, 5,272.2, 5,250.7)"
    # random search's winner was not measured in this check study: the verdict falls back on
    # its tuning study's runs, and says they were not side by side
    verdict = next(line for line in lines if line.startswith("* random search's best"))
    assert "from fresh starts" not in verdict and verdict.endswith("; not side by side")


def test_the_h100_check_study_holds_the_figures_benchmarks_quotes() -> None:
    """BENCHMARKS.md "The same check on an H100": the H200 winner #21, the defaults and the
    hand-picked combination from fresh starts on two H100s (the first four runs on one,
    2026-12-05; the five re-measurements left on another, 2026-12-07), with NVML telemetry
    and the finer vLLM start-up stages of every start."""
    from autotune.results import best_estimate

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(
        study_name="vllm-h200-dense-check",
        storage=f"sqlite:///{ROOT / 'benchmarks' / 'h100' / 'vllm-dense-check-h100.db'}",
    )
    trials = study.trials
    assert [t.user_attrs.get("label") for t in trials] == [None, "hand-picked", "winner #21"]
    values = [t.value for t in trials]
    assert all(v is not None for v in values)
    assert [round(v or 0.0, 1) for v in values] == [3814.3, 5043.0, 5245.3]
    best = best_estimate(study)
    assert best is not None and best.trial.number == 2 and best.n == 3
    assert round(best.mean, 1) == 5280.2
    for t in trials:
        gpu = t.user_attrs["telemetry"]["gpus"][0]
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"
        stages = [s["stage"] for s in t.user_attrs["startup"]["server"]["stages"]]
        assert stages[:3] == [
            "resolving the model's architecture",
            "configuring the engine, starting its core",
            "initializing the engine core",
        ]
    joules = [t.user_attrs["telemetry"]["energy_per_token_j"] for t in trials]
    assert [round(j, 3) for j in joules] == [0.174, 0.118, 0.116]
    remeasured = sorted(k for k in study.user_attrs if k.startswith("remeasure:"))
    assert remeasured == [f"remeasure:{n}:{r}" for n in range(3) for r in (1, 2)]


def test_the_reader_on_the_dense_winner_taken_to_an_h100() -> None:
    lines = _reader().report(DENSE, 20)
    start = next(i for i, line in enumerate(lines) if "winner on an H100, untuned" in line)
    section = lines[start:]
    assert "GPU-15864ad5, GPU-d64d6eee" in section[0]
    defaults = _row(section, "vLLM defaults, 3")
    assert defaults[3] == "3,887.1 (n=3: 3,814.3, 3,921.4, 3,925.4)"
    assert defaults[4] == "0.170 (n=3)"
    hand = _row(section, "hand-picked")
    assert hand[3] == "5,188.6 (n=3: 5,043.0, 5,272.2, 5,250.7)"
    winner = _row(section, "winner re-measured")
    assert winner[3] == "5,280.2 (n=3: 5,245.3, 5,297.7, 5,297.7)"
    assert winner[5] == "+35.8% (95% CI +31.4 to +40.3%)"
    verdict = section[section.index("The winner re-measured (winner #21) on the H100 against:") :]
    # the GPU as a block: the gain over the defaults holds on both H100s; the hand-picked
    # combination is level with the winner here too
    assert verdict[1].endswith(
        "the GPU as a block: +36.6% (95% CI +33.4 to +39.9%; 6 runs on 2 GPUs, 3 df)"
    )
    assert verdict[2].endswith(
        "the GPU as a block: +2.6% (95% CI -1.1 to +6.4%; 6 runs on 2 GPUs, 3 df)"
    )


def test_the_reader_on_the_h100_moe_side_by_side() -> None:
    """The MoE side-by-side runs on an H100 (studies/vllm-h100-moe*.yaml): its results are
    read from benchmarks/h100/ and the table names the card; every arm is done: TPE and random
    (16 restarts each), the sweep (16 of 16 points, vLLM's defaults among them: its row is
    measured against its own 1024 x 8192 point), the check study (defaults, hand-picked and
    TPE's winner from 3 fresh starts each, which the gains are now measured against) and the
    winner under both load generators on one start."""
    reader = _reader()
    assert reader.card_of("vllm-h100-moe") == ("H100", ROOT / "benchmarks" / "h100")
    assert reader.card_of("vllm-h200-moe") == ("H200", ROOT / "benchmarks" / "h200")
    lines = reader.report("vllm-h100-moe", 16)
    assert lines[0].endswith("side by side on one H100 (budget 16 restarts per tuning arm)")
    assert "the check study's defaults, 3 fresh starts, 8,159.9 tok/s" in lines[2]
    tpe = _row(lines, "autotune, TPE")
    assert tpe[1] == "16 (14 trials + 2 re-measured)"
    assert tpe[2] == "#23: enable_prefix_caching=off, quantization=fp8"
    assert tpe[3] == "9,040.8 (n=2: 9,028.7, 9,052.9)"
    assert tpe[4] == "0.041 (n=2)" and tpe[5].startswith("+10.8% (95% CI -1.6 to +23.2%)")
    random = _row(lines, "random search")
    assert random[1] == "16 (14 trials + 2 re-measured)"
    assert random[2] == "#0: vLLM's defaults"
    assert random[3] == "6,906.6 (n=2: 6,827.1, 6,986.1)"
    sweep = _row(lines, "`vllm bench sweep serve`")
    # points on four H100s in turn: the row says they never ran side by side
    assert sweep[1] == "19 (16 of 16 combinations done; in 4 sittings)"
    assert sweep[2] == "max_num_seqs=512, max_num_batched_tokens=16384"
    assert sweep[3].startswith("8,644.6 (n=3: 8,533.0, 8,670.3, 8,730.5)")
    assert sweep[5] == "+19.7% (95% CI +4.8 to +34.5%) over its own 1024 x 8192 point"
    defaults = _row(lines, "vLLM defaults, 3 fresh starts")
    assert defaults[3] == "8,159.9 (n=3: 7,702.1, 8,293.5, 8,484.1)"
    hand = _row(lines, "hand-picked")
    assert hand[2] == "quantization=fp8" and hand[3] == "9,191.4 (n=3: 9,085.0, 9,334.5, 9,154.8)"
    # Done as issue 28 asks: the winner from fresh starts beats the defaults, its 95% interval
    # above zero, and is ahead of the hand-picked combination and the sweep's best.
    winner = _row(lines, "winner re-measured (winner #23)")
    assert winner[3] == "9,583.2 (n=3: 9,406.1, 9,564.9, 9,778.6)"
    assert winner[5] == "+17.4% (95% CI +3.8 to +31.1%)"
    agreement = _row(lines, "winner, one fresh start")
    assert agreement[3].startswith("9,226.2 (n=2: 9,322.4, 9,129.9) vs 9,371.1")
    assert agreement[5] == "vllm bench serve -1.5% vs autotune's client"
    # Below the table, the done criterion arm by arm; the sweep by its own client on both
    # sides (the agreement run's `vllm bench serve` runs of the winner).
    start = lines.index("The winner re-measured (winner #23) against each arm:") + 1
    verdict = lines[start : lines.index("", start)]
    assert verdict == [
        "* vLLM's defaults (3 fresh starts): +17.4% (95% CI +3.8 to +31.1%); "
        "side by side, one session",
        "* the hand-picked combination: +4.3% (95% CI -0.3 to +8.8%); side by side, one session",
        "* random search's best (#0: vLLM's defaults): +38.8% (95% CI +30.4 to +47.1%); "
        "not side by side",
        "* the sweep's best (max_num_seqs=512, max_num_batched_tokens=16384): +6.7% (95% CI "
        "-9.8 to +23.3%); `vllm bench serve` on both sides, not side by side",
    ]
    # Last, what `autotune explain` of the winner stored (2026-12-07, two H100s): fp8 weights
    # bought the gain, 95% interval above zero, pooled and with the GPU as a block (the last
    # column: the runs span three H100s, the check's and the explanation's two); prefix
    # caching off is within the noise.
    explained = lines[lines.index("", start) + 1 :]
    assert explained[0].startswith(
        "What the winner's changes bought (`autotune explain` of #23: 5 restarts + 9 borrowed): "
        "the winner 9,467.9 (n=5), vLLM's defaults 8,159.9 (n=3); run-to-run noise 3.5%."
    )
    assert explained[4:6] == [
        "| quantization: default -> fp8 | 8,257.9 (n=3) | +1,210.0 (+719.1 to +1,701.0) | +12.8% "
        "| +11.5% (+4.4% to +18.1%) |",
        "| enable_prefix_caching: default -> off | 9,191.4 (n=3) | +276.5 (-246.3 to +799.2) "
        "| +2.9% | +4.1% (-2.7% to +10.4%) |",
    ]
    assert explained[7].startswith(
        "* runs measured here on an earlier machine (GPU-659a7970) read +1.4% against this "
        "machine's runs of the same 2 configuration(s) (95% interval -6.2..+9.7%): within the noise"
    )
    assert explained[8].startswith(
        "* runs lent by study 'vllm-h100-moe-check' read +1.9% against this explanation's own "
        "runs of the same 1 configuration(s) (95% interval -7.4..+12.3%): within the noise"
    )
    assert explained[9] == (
        "* with the GPU as a block (3 GPUs: GPU-659a7970 +0.0%, GPU-b94e07e8 +2.1%, "
        "GPU-d2b8e5fb -1.9%): run-to-run noise 3.6%, 8 df"
    )
    study = optuna.load_study(
        study_name="vllm-h100-moe",
        storage=f"sqlite:///{ROOT / 'benchmarks' / 'h100' / 'vllm-h100-moe.db'}",
    )
    measured = [t for t in study.trials if "telemetry" in t.user_attrs]
    assert len(measured) >= 13
    assert {t.user_attrs["telemetry"]["gpus"][0]["name"] for t in measured} == {
        "NVIDIA H100 80GB HBM3"
    }


def test_the_moe_explanation_borrows_every_check_run_and_measures_one_revert() -> None:
    """What the next H100 session's `autotune explain` of the MoE winner (#23: prefix caching
    off, fp8 weights) will measure, read from the stored databases: all 9 runs of the check
    study are borrowable (same engine version and inherited environment, fresh starts), 3 each
    of the defaults, the winner and the winner with prefix caching reverted (the hand-picked
    fp8 weights), so the revert of fp8 is the one configuration left to measure."""
    definition = load_study_definition(ROOT / "studies" / "vllm-h100-moe.yaml")
    space = load_space(ROOT / "studies" / definition.space)
    h100 = ROOT / "benchmarks" / "h100"
    study = optuna.load_study(
        study_name="vllm-h100-moe", storage=f"sqlite:///{h100 / 'vllm-h100-moe.db'}"
    )
    winner = TrialRecord.from_attrs(study.trials[23].user_attrs, where="winner")
    baseline = TrialRecord.from_attrs(study.trials[0].user_attrs, where="baseline")
    check = optuna.load_study(
        study_name="vllm-h100-moe-check", storage=f"sqlite:///{h100 / 'vllm-h100-moe-check.db'}"
    )
    borrowed = borrowable_runs(
        check,
        space=space,
        engine_version=winner.engine_version or {},
        inherited={name: svc.inherited_env for name, svc in winner.services.items()},
    )
    assert not borrowed.skipped and len(borrowed.runs) == 9
    changed = {k for k, v in winner.config.items() if v != baseline.config[k]}
    assert changed == {"enable_prefix_caching", "quantization"}
    reverts = {
        lever: space.config_key({**winner.config, lever: baseline.config[lever]})
        for lever in changed
    }
    runs = {
        key: sum(run.key == key for run in borrowed.runs)
        for key in (
            space.config_key(winner.config),
            space.config_key(baseline.config),
            *reverts.values(),
        )
    }
    assert runs[space.config_key(winner.config)] == 3
    assert runs[space.config_key(baseline.config)] == 3
    assert runs[reverts["enable_prefix_caching"]] == 3  # the hand-picked fp8 weights
    assert runs[reverts["quantization"]] == 0  # the one left to measure


def test_the_moe_plan_measures_the_fp8_revert_twice_and_the_winner_once_beside_the_check() -> None:
    """The planner over the same stored runs, ``--repeats 2 --no-path --no-minimal``: the
    check study lent every run of the configurations it touches (3 each, more than 2), so
    beside the fp8 revert's two runs the explanation measures the winner once, and the
    drift between the check's H100 and the explanation's is measured (3 restarts, where the
    explanation's H100 reads what the check's did). The
    tuning study itself would lend its #17 (that revert; --own-runs), which the plan leaves
    out: its H100s ran the defaults 17% below the check's."""
    definition = load_study_definition(ROOT / "studies" / "vllm-h100-moe.yaml")
    space = load_space(ROOT / "studies" / definition.space)
    h100 = ROOT / "benchmarks" / "h100"
    study = optuna.load_study(
        study_name="vllm-h100-moe", storage=f"sqlite:///{h100 / 'vllm-h100-moe.db'}"
    )
    check = optuna.load_study(
        study_name="vllm-h100-moe-check", storage=f"sqlite:///{h100 / 'vllm-h100-moe-check.db'}"
    )
    from autotune.results import best_estimate

    estimate = best_estimate(study)
    assert estimate is not None and estimate.trial.number == 23
    winner = estimate.trial
    changes = ChangeSet(space, baseline=space.baseline_params(), winner=winner.config)
    planner = Planner(
        changes,
        ExplainSettings(repeats=2, path=False, minimal=False),
        winner=23,
        prior_noise=(estimate.noise_sd, estimate.noise_df),
    )
    lent: dict[str, list[ExplainRun]] = {}
    for run in borrowable_runs(check, space=space, engine_version=winner.engine_version).runs:
        stored = lent.setdefault(run.key, [])
        stored.append(run.model_copy(update={"index": len(stored)}))
    held = {key: len(rs) for key, rs in lent.items()}
    # what the check read of a configuration, the unlent revert at 8,000 tok/s
    check_read = {key: sum(r.value or 0.0 for r in rs) / len(rs) for key, rs in lent.items()}

    def plan(machine: float) -> tuple[list[str], list[str]]:
        """What the explanation measures on a machine reading ``machine`` x the check's
        (1.0 the same, 1 / 1.17 the tuning sessions' H100s), and the studies it leaves out."""
        runs = {key: list(rs) for key, rs in lent.items()}
        state = planner.new_state()
        whys = []
        while not isinstance(step := planner.next(runs, state), Finished):
            if isinstance(step, Decide):
                state = step.state
                continue
            whys.append(step.why)
            value = machine * check_read.get(step.key, 8000.0)
            runs.setdefault(step.key, []).append(
                ExplainRun(key=step.key, index=len(runs.get(step.key, [])), config=step.config,
                           values=[value * (1.01 if len(whys) % 2 else 0.99)], feasible=True)
            )  # fmt: skip
            state = state.model_copy(update={"runs": state.runs + 1})
        return whys, state.left_out

    assert plan(1.0) == (
        [
            "the winner without quantization, run 1",
            "the winner without quantization, run 2",
            "the winner, run 4 (beside the lent runs: the occasions compared)",
        ],
        [],
    )
    # on a machine 17% slower the check's runs are left out: winner, baseline and the
    # prefix-caching revert measured here, 2 runs each (8 restarts in all)
    whys, left_out = plan(1 / 1.17)
    assert left_out == ["vllm-h100-moe-check"] and len(whys) == 8
    leave, per_config = own_terms(changes, 2)
    own = borrowable_runs(
        study, space=space, engine_version=winner.engine_version, leave=leave,
        per_config=per_config, held=held,
    )  # fmt: skip
    assert [r.source for r in own.runs] == ["vllm-h100-moe#17"]
    assert own.runs[0].key == changes.revert_alone("quantization")[0].key
    # What the first H100 did (2026-12-07): the plan of an unchanged machine, 3 restarts; the
    # nine borrowed runs stored beside them, none of the study's own (a second H100 added 2
    # with --repeats 3: the next test)
    explained = load_runs(study)
    measured: dict[str, int] = {}
    for key, rs in explained.items():
        for r in rs:
            if r.source is None and r.machine == "GPU-659a7970-6012-7a78-d3dc-cb6a6afddaf0":
                measured[key] = measured.get(key, 0) + 1
    assert measured == {
        changes.revert_alone("quantization")[0].key: 2,
        space.config_key(winner.config): 1,
    }
    assert all(
        r.source.startswith("vllm-h100-moe-check#")
        for rs in explained.values() for r in rs if r.source is not None
    )  # fmt: skip
    assert sum(len(rs) for rs in explained.values()) == 14


def test_the_moe_fp8_lever_decided_with_the_gpu_as_a_block_in_the_2_restarts_planned() -> None:
    """After the first H100 (GPU-659a7970) the MoE winner's fp8 share read with the GPU as a
    block was +8.7%, its interval across zero: the revert ran beside one run of the winner.
    Replayed from those runs, `--repeats 3` on the next H100 measures the fp8 revert and the
    winner beside each other, 2 restarts, and on a GPU reading these runs as before (3%
    slower, 3.5% noise) the lower bound clears zero on every one of 6 noise seeds;
    `--repeats 2` measures nothing more. The second H100 (GPU-d2b8e5fb, 2026-12-07) measured
    exactly those 2, and the share read +11.5% (+4.4..+18.1%)."""
    path = str(ROOT / "tests" / "explain")
    if path not in sys.path:
        sys.path.insert(0, path)
    replay = importlib.import_module("explain_replay").replay
    from autotune.explain import gpu_blocked, load_explanation, load_state
    from autotune.results import best_estimate

    definition = load_study_definition(ROOT / "studies" / "vllm-h100-moe.yaml")
    space = load_space(ROOT / "studies" / definition.space)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(
        study_name="vllm-h100-moe",
        storage=f"sqlite:///{ROOT / 'benchmarks' / 'h100' / 'vllm-h100-moe.db'}",
    )
    estimate, e = best_estimate(study), load_explanation(study)
    stored = load_state(study)
    assert estimate is not None and e is not None and stored is not None and stored.runs == 5
    runs = load_runs(study)
    second = "GPU-d2b8e5fb-8985-8c04-5b8f-966dc767f2f4"
    done = sorted(
        (r for rs in runs.values() for r in rs if r.machine == second and r.source is None),
        key=lambda r: r.measured_at or 0.0,
    )
    before = {k: [r for r in rs if r.machine != second] for k, rs in runs.items()}
    before = {k: rs for k, rs in before.items() if rs}
    then = gpu_blocked(e, before)
    assert then is not None and (fp8 := then.shares["quantization"]) is not None
    assert fp8.low is not None and fp8.low < 0 < fp8.value
    changes = ChangeSet(space, baseline=space.baseline_params(), winner=estimate.trial.config)
    read = {k: sum(r.value or 0.0 for r in rs) / len(rs) for k, rs in before.items()}

    def truth(config: dict[str, object]) -> float:
        return read[space.config_key(config)]

    def planner(repeats: int) -> Planner:
        settings = ExplainSettings(repeats=repeats, max_repeats=6, path=False, minimal=False)
        return Planner(changes, settings, winner=23,
                       prior_noise=(estimate.noise_sd, estimate.noise_df))  # fmt: skip

    state = stored.model_copy(update={"runs": 3})
    kwargs = {"runs": before, "state": state, "machine": second, "speed": 0.97,
              "noise": 0.035}  # fmt: skip
    assert replay(planner(2), truth, **kwargs).measured == []
    lows = []
    for seed in range(6):
        planned = replay(planner(3), truth, seed=seed, **kwargs)
        assert [m.why for m in planned.measured] == [
            "the winner without quantization, run 3",
            "the winner, run 5 (beside the lent runs: the occasions compared)",
        ]
        assert [m.key for m in planned.measured] == [r.key for r in done]
        after = gpu_blocked(e, planned.runs)
        assert after is not None and (share := after.shares["quantization"]) is not None
        assert share.low is not None
        lows.append(share.low)
    assert min(lows) > 0, lows
    now = gpu_blocked(e, runs)  # what the second H100's runs gave
    assert now is not None and (fp8 := now.shares["quantization"]) is not None
    assert now.share_text("quantization") == "+11.5% (+4.4% to +18.1%)"


H100_EXPLAIN = ROOT / "benchmarks" / "h100" / "vllm-h200-dense-explain-h100.db"


def test_the_dense_winner_explained_on_an_h100() -> None:
    """2026-12-07: `autotune explain` of the H200 winner #21 on two H100s, borrowing the H100
    check's 9 runs: 6 reverts once on GPU-e8989a30 (the lease ended there), the last revert,
    the fp8 revert and the winner on GPU-f51185dd, then `--repeats 2`'s second run of each
    other revert on it (15 restarts). fp8 weights and fp8 KV, the two levers the
    hand-picked combination shares with the winner, carry the gain, both intervals above
    zero; each of the other five is within the noise: why the winner is level with the
    hand-picked. The two H100s and the lending check read alike, so every run stays in."""
    lines = _reader().report(DENSE, 20)
    start = next(i for i, line in enumerate(lines) if line.startswith("What the winner's"))
    assert "of #21: 15 restarts + 9 borrowed)" in lines[start]
    assert "the winner 5,322.6 (n=4), vLLM's defaults 3,887.1 (n=3)" in lines[start]
    table = lines[start + 2 :]
    fp8 = _row(table, "quantization: default -> fp8")
    assert fp8[1] == "4,141.1 (n=2)" and fp8[2].startswith("+1,181.6 (+1,027.9 to ")
    kv = _row(table, "kv_cache_dtype: default -> fp8")
    assert kv[1] == "5,033.3 (n=2)" and kv[2].startswith("+289.4 (+116.8 to ")
    for lever in ("max_num_batched_tokens", "enable_prefix_caching", "gpu_memory_utilization",
                  "max_num_seqs", "cudagraph_mode"):  # fmt: skip
        row = _row(table, f"{lever}: default -> ")
        assert row[1].endswith("(n=2)"), row
        low, high = row[2].split("(")[1].rstrip(")").split(" to ")
        assert float(low.replace(",", "")) < 0 < float(high.replace(",", ""))
    drift = [line for line in lines[start:] if line.startswith("* runs ")]
    assert len(drift) == 2 and all(line.endswith("within the noise") for line in drift)
    assert "earlier machine (GPU-e8989a30) read -2.1%" in drift[0]
    assert "'vllm-h200-dense-check' read -3.1%" in drift[1]
    # The GPU as a block (4 H100s): the offsets between them (up to 4%) come out of the
    # noise (1.8% -> 1.0%) and of the small changes, which read -0.1..+1.2%, every interval
    # straddling zero; the two fp8 levers stay above it.
    assert lines[-1] == (
        "* with the GPU as a block (4 GPUs: GPU-15864ad5 +0.0%, GPU-d64d6eee +2.6%, "
        "GPU-e8989a30 +1.9%, GPU-f51185dd +4.1%): run-to-run noise 1.0%, 11 df"
    )
    assert fp8[4] == "+23.2% (+21.0% to +25.4%)" and kv[4] == "+6.6% (+3.9% to +9.3%)"
    for lever in ("max_num_batched_tokens", "enable_prefix_caching", "gpu_memory_utilization",
                  "max_num_seqs", "cudagraph_mode"):  # fmt: skip
        low, high = _row(table, f"{lever}: default -> ")[4].split("(")[1].rstrip(")").split(" to ")
        assert float(low.rstrip("%")) < 0 < float(high.rstrip("%"))


def test_the_h100_measured_what_the_explanations_plan_said() -> None:
    """The stored explanation, cut back to where each device call resumed it, replayed:
    the planner asks for exactly the runs the H100 then measured, in order. After the first
    GPU's 6 runs (`--repeats 1`), on a GPU reading as that one: the last revert, then the
    fp8 revert and the winner beside the earlier runs (3 restarts; 10% apart it would have
    been 9, both earlier occasions left out); after those 9, `--repeats 2`: a second run of
    each revert run once (6). Telling the next session's cost from the stored runs is what
    lets it be planned into one lease."""
    path = str(ROOT / "tests" / "explain")
    if path not in sys.path:
        sys.path.insert(0, path)
    replay = importlib.import_module("explain_replay").replay
    from autotune.explain import load_state
    from autotune.results import best_estimate

    definition = load_study_definition(ROOT / "studies" / f"{DENSE}.yaml")
    space = load_space(ROOT / "studies" / definition.space)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=DENSE, storage=f"sqlite:///{H100_EXPLAIN}")
    estimate = best_estimate(study)
    assert estimate is not None and estimate.trial.number == 21
    changes = ChangeSet(space, baseline=space.baseline_params(), winner=estimate.trial.config)
    runs, stored = load_runs(study), load_state(study)
    assert stored is not None and stored.runs == 15 and stored.left_out == []
    own = sorted(
        (r for rs in runs.values() for r in rs if r.source is None),
        key=lambda r: r.measured_at or 0.0,
    )
    first_gpu, second_gpu = (
        "GPU-e8989a30-42b3-c78f-c4ed-24c5ff1d6b6b",
        "GPU-f51185dd-11a3-aa23-8661-98bc73e5d1de",
    )
    assert [r.machine for r in own] == [first_gpu] * 6 + [second_gpu] * 9
    read = {k: sum(r.value or 0.0 for r in rs) / len(rs) for k, rs in runs.items()}

    def truth(config: dict[str, object]) -> float:
        return read[space.config_key(config)]

    def upto(n: int) -> dict[str, list[ExplainRun]]:
        kept = {id(r) for r in own[:n]}
        cut = {k: [r for r in rs if r.source or id(r) in kept] for k, rs in runs.items()}
        return {k: rs for k, rs in cut.items() if rs}

    def planner(repeats: int) -> Planner:
        settings = ExplainSettings(repeats=repeats, max_repeats=max(repeats, 6), path=False,
                                   minimal=False)  # fmt: skip
        return Planner(changes, settings, winner=21,
                       prior_noise=(estimate.noise_sd, estimate.noise_df))  # fmt: skip

    # the first call: the state the first H100 left (6 runs, no order yet), resumed
    first = stored.model_copy(update={"runs": 6, "order": None})
    same = replay(planner(1), truth, runs=upto(6), state=first,
                  machine=second_gpu, noise=0.017)  # fmt: skip
    assert [m.why for m in same.measured] == [
        "the winner without cudagraph_mode, run 1",
        "the winner without quantization, run 2 (beside the lent runs: the occasions compared)",
        "the winner, run 4 (beside the lent runs: the occasions compared)",
    ]
    assert [m.key for m in same.measured] == [r.key for r in own[6:9]]
    assert same.state.left_out == [] and same.finished is not None
    assert same.state.order == stored.order
    apart = replay(planner(1), truth, runs=upto(6), state=first, machine="GPU-ffffffff-0",
                   speed=0.9, noise=0.017)  # fmt: skip
    assert len(apart.measured) == 9
    assert apart.state.left_out == ["(this explanation on GPU-e8989a30)", "vllm-h200-dense-check"]
    # the second call, --repeats 2 over the 9: a second run of each revert measured once
    second = replay(planner(2), truth, runs=upto(9), state=stored.model_copy(update={"runs": 9}),
                    machine=second_gpu, noise=0.017)  # fmt: skip
    assert [m.key for m in second.measured] == [r.key for r in own[9:]]
    assert all(m.why.endswith("run 2") for m in second.measured)
    assert second.finished is not None and second.state.left_out == []


def test_best_says_when_a_configurations_runs_span_machines() -> None:
    """`autotune best` of the H100 check: its winner's three runs came from two H100s (the
    study resumed after a lease ended); each run names its GPU and a row says the estimate
    spans them. The MoE check ran in one session on one GPU: no such row."""
    h100 = ROOT / "benchmarks" / "h100"

    def best(study: str, db: Path) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "autotune", "best", "--study", study, "--storage",
             f"sqlite:///{db}"],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "COLUMNS": "400"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return " ".join(out.stdout.split())

    text = best("vllm-h200-dense-check", h100 / "vllm-dense-check-h100.db")
    assert (
        "trial #2 [GPU-15864ad5]: 5,245.3; re-run 1 [GPU-15864ad5]: 5,297.7; "
        "re-run 2 [GPU-d64d6eee]: 5,297.7"
    ) in text
    assert "│ measured on │ 2 machines (GPU-15864ad5: 2, GPU-d64d6eee: 1)" in text
    moe = best("vllm-h100-moe-check", h100 / "vllm-h100-moe-check.db")
    assert "trial #2: 9,406.1; re-run 1: 9,564.9; re-run 2: 9,778.6" in moe
    assert "measured on" not in moe
