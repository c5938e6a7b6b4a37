"""Time the README's main job, compare measurement settings in the loop, time the tuner.

Main job: ``autotune run --trials N`` on the bundled simulated deployment in a scratch
directory (its own SQLite file), then the wall time, time per trial, phase breakdown,
tuner overhead, baseline, winner (mean +- 95% CI after re-measurement) and, because the
deployment is simulated, the winner's true throughput in the performance model::

    .venv/bin/python benchmarks/default_study.py --trials 200

Side by side (``--variants``): the same study with different measurement settings and the
same sampler seed, run in alternating chunks of ``--chunk`` trials (``autotune run``
resumes), so load on the machine falls on every variant alike; re-measurement runs once,
at the end::

    .venv/bin/python benchmarks/default_study.py --trials 100 --variants fixed128,adaptive

Tuner overhead before/after (``--overhead N``): the loop's own work for N trials (TPE ask
and suggest, journal, storing the outcome, counting, the incumbent) replayed without a
deployment on two SQLite studies, trial by trial in alternation: one written the way the
loop wrote before (a commit per parameter and attribute, a scan of every trial for the
best), one the way it writes now (one transaction per block, counts and incumbent in
memory)::

    .venv/bin/python benchmarks/default_study.py --overhead 200
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from winner_noise import true_throughput  # noqa: E402

from autotune.results import (  # noqa: E402
    TrialResult,
    best_estimate,
    feasible,
    format_estimate,
    load_remeasurements,
)
from autotune.sim.optimum import true_optimum  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.study.definition import load_study_definition  # noqa: E402

STUDY_FILE = REPO / "studies" / "dsv4-flash-sim.yaml"
MEASURED = ("restart", "probe", "warmup", "measure")


def variant_settings(name: str, target: float, eq_requests: int) -> dict[str, Any]:
    """Changes to the study file for a named variant."""
    if name == "shipped":
        return {}
    if name.startswith("fixed"):
        count = int(name[len("fixed") :] or 32) if name != "fixed-eq" else eq_requests
        return {
            "load": {"requests": count, "target_rel_ci": None, "min_duration_s": 0.0},
            "early_abort": None,
        }
    if name == "adaptive":
        return {"load": {"target_rel_ci": target}, "early_abort": {"abort_below": 0.9}}
    if name == "adaptive-noabort":
        return {"load": {"target_rel_ci": target}, "early_abort": None}
    raise SystemExit(f"unknown variant {name!r}")


def write_study(tmp: Path, name: str, changes: dict[str, Any], *, remeasure: bool) -> Path:
    data = yaml.safe_load(STUDY_FILE.read_text())
    data["space"] = str((STUDY_FILE.parent / data["space"]).resolve())
    data["deployment"] = str((STUDY_FILE.parent / data["deployment"]).resolve())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    if not remeasure:
        data["remeasure"] = {"top_k": 0}
    path = tmp / f"{name}{'' if remeasure else '-chunk'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_variants(
    variants: list[str],
    trials: int,
    chunk: int,
    seed: int | None,
    target: float,
    eq: int,
    keep: Path | None = None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as scratch:
        tmp = keep or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        walls: dict[str, float] = collections.defaultdict(float)
        files = {
            v: (
                write_study(tmp, v, variant_settings(v, target, eq), remeasure=False),
                write_study(tmp, v, variant_settings(v, target, eq), remeasure=True),
            )
            for v in variants
        }
        steps = list(range(chunk, trials, chunk)) + [trials] if len(variants) > 1 else [trials]
        for step in steps:
            for v in variants:
                work = tmp / v
                work.mkdir(exist_ok=True)
                study_file = files[v][1] if step == trials else files[v][0]
                cmd = [
                    sys.executable, "-m", "autotune", "run", "--trials", str(step), "--quiet",
                    "--study", "dsv4-flash-sim", "--storage", f"sqlite:///{work / 'bench.db'}",
                    "--study-file", str(study_file),
                ]  # fmt: skip
                if seed is not None:
                    cmd += ["--seed", str(seed)]
                started = time.monotonic()
                subprocess.run(cmd, cwd=work, check=True)
                walls[v] += time.monotonic() - started
        rows = [summarize(v, tmp / v / "bench.db", walls[v]) for v in variants]
    print_rows(rows)


def summarize(name: str, db: Path, wall: float) -> dict[str, Any]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="dsv4-flash-sim", storage=f"sqlite:///{db}")
    definition = load_study_definition(STUDY_FILE)
    space = load_space(definition.resolve(definition.space))
    load = definition.load
    optimum = true_optimum(
        concurrency=load.concurrency, input_len=load.input_len, output_len=load.output_len
    ).throughput
    trials = study.trials
    phases: dict[str, float] = collections.defaultdict(float)
    tuner_ms = []
    for t in trials:
        ps = TrialResult.from_frozen(t).phase_seconds  # tuner includes the storage write
        for k, v in ps.items():
            phases[k] += v
        if ps.get("restart"):
            tuner_ms.append(1000 * ps.get("tuner", 0.0))
    # What the aborted trials would have cost measured in full: the closed loop finishes
    # requests at a steady pace, so the rest would have taken measure x (count / done - 1).
    count = definition.load.requests or 0
    saved = 0.0
    for t in trials:
        done = (t.user_attrs.get("metrics") or {}).get("completed") or 0
        if t.user_attrs.get("aborted") and done and count > done:
            saved += t.user_attrs["phase_seconds"].get("measure", 0.0) * (count / done - 1)
    remeasured = load_remeasurements(study)
    re_phases: dict[str, float] = collections.defaultdict(float)
    for m in remeasured:
        for k, v in m.phase_seconds.items():
            re_phases[k] += v
    on_deployment = sum(phases[k] + re_phases[k] for k in MEASURED)
    failures = collections.Counter(t.user_attrs.get("failure") or "ok" for t in trials)
    baseline = next(t for t in trials if t.user_attrs.get("is_baseline"))
    winner = best_estimate(study)
    true_of = {}
    evaluated = []
    for t in trials:
        if feasible(t) and t.user_attrs.get("config"):
            value = true_throughput(space, t.user_attrs["config"], load)
            true_of[t.number] = value
            if value is not None:
                evaluated.append(value)
    single = max(
        (t for t in trials if feasible(t) and not t.user_attrs.get("aborted")),
        key=lambda t: (t.values[0], -t.number),
    )
    row = {
        "variant": name,
        "wall_s": wall,
        "trials": len(trials),
        "s_per_trial": wall / len(trials),
        "phases": dict(phases),
        "remeasure_s": sum(re_phases[k] for k in (*MEASURED, "tuner")),
        "remeasured": len(remeasured),
        "tuner_share": phases["tuner"] / phases["total"] if phases["total"] else None,
        "tuner_median_ms": statistics.median(tuner_ms) if tuner_ms else None,
        "wall_overhead_share": (wall - on_deployment) / wall,
        "aborted": sum(1 for t in trials if t.user_attrs.get("aborted")),
        "abort_saved_s": saved,
        "outcomes": dict(failures.most_common()),
        "baseline": baseline.values[0],
        "winner": None if winner is None else winner.trial.number,
        "winner_estimate": None if winner is None else format_estimate(winner),
        "winner_true_pct": None
        if winner is None or true_of.get(winner.trial.number) is None
        else 100 * true_of[winner.trial.number] / optimum,
        "single_run_winner": single.number,
        "single_run_value": single.values[0],
        "single_run_true_pct": None
        if true_of.get(single.number) is None
        else 100 * true_of[single.number] / optimum,
        "best_evaluated_true_pct": 100 * max(evaluated) / optimum if evaluated else None,
        "optimum": optimum,
    }
    print(json.dumps(row), flush=True)
    return row


def print_rows(rows: list[dict[str, Any]]) -> None:
    first = rows[0]
    for r in rows:
        p = r["phases"]
        print(
            f"\n[{r['variant']}] trials {r['trials']} wall {r['wall_s']:.0f} s "
            f"({r['s_per_trial']:.2f} s/trial, x{r['wall_s'] / first['wall_s']:.2f} vs "
            f"{first['variant']}); re-measurement {r['remeasured']} runs {r['remeasure_s']:.0f} s"
        )
        print(
            "  phases (s): "
            + ", ".join(f"{k} {p.get(k, 0.0):.0f}" for k in (*MEASURED, "tuner", "total"))
        )
        print(
            f"  tuner overhead: {100 * (r['tuner_share'] or 0):.2f}% of trial time (median "
            f"{r['tuner_median_ms'] or 0:.0f} ms/launched trial); wall clock not on the "
            f"deployment: {100 * r['wall_overhead_share']:.2f}%"
        )
        share = 100 * r["abort_saved_s"] / r["wall_s"]
        print(
            f"  outcomes: {r['outcomes']}; aborted early: {r['aborted']} (saved ~"
            f"{r['abort_saved_s']:.0f} s of measuring, {share:.1f}% of the wall time, against "
            "measuring them in full)"
        )
        print(
            f"  baseline {r['baseline']:.1f} tok/s; winner #{r['winner']}: {r['winner_estimate']} "
            f"-> true {r['winner_true_pct']:.1f}% of the model optimum "
            f"({r['optimum']:.0f} tok/s); single-run max #{r['single_run_winner']} "
            f"{r['single_run_value']:.1f} -> true {r['single_run_true_pct']:.1f}%; best "
            f"evaluated: {r['best_evaluated_true_pct']:.1f}%"
        )


# ------------------------------------------------------------------ tuner overhead


def overhead_replay(n: int, seed: int) -> None:
    """The loop's own work, before (per-write commits, full scans) vs after, alternating."""
    from autotune.study.journal import Entry, Journal
    from autotune.study.objectives import Objective
    from autotune.study.record import finish_trial
    from autotune.study.samplers import make_sampler
    from autotune.study.storage import batched_writes, batching, open_storage
    from autotune.trial import TrialOutcome, TrialRecord

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    definition = load_study_definition(STUDY_FILE)
    space = load_space(definition.resolve(definition.space))
    objective = Objective(kind="throughput", slo=definition.slo)
    template = _template_attrs()
    with tempfile.TemporaryDirectory(prefix="autotune-overhead-") as scratch:
        tmp = Path(scratch)
        loops: dict[str, tuple[optuna.Study, Journal, dict[str, tuple[float, int] | None]]] = {}
        for mode in ("before", "after"):
            url = f"sqlite:///{tmp / (mode + '.db')}"
            storage = open_storage(url, create=True)
            study = optuna.create_study(
                study_name=mode,
                storage=batching(storage) if mode == "after" else storage,
                sampler=make_sampler("tpe", seed=seed),
                direction="maximize",
            )
            study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
            journal = Journal(tmp / mode / "journal", storage_url=url, study_name=mode)
            loops[mode] = (study, journal, {"incumbent": None})
        timings: dict[str, dict[str, list[float]]] = {
            m: collections.defaultdict(list) for m in loops
        }
        rng = random.Random(seed)
        for i in range(n):
            noise = math.exp(rng.gauss(0.0, 0.05))
            for mode, (study, journal, state) in loops.items():
                buckets = timings[mode]
                t0 = time.perf_counter()
                trial = study.ask()
                t1 = time.perf_counter()
                if mode == "after":
                    with batched_writes(study, trial._trial_id):
                        config = space.suggest(trial)
                else:
                    config = space.suggest(trial)
                t2 = time.perf_counter()
                value = (
                    None
                    if space.violations(config)
                    else true_throughput(space, config, definition.load)
                )
                attrs = json.loads(json.dumps(template))
                attrs["config"] = config
                if value is None:
                    outcome = TrialOutcome(
                        values=objective.failed_values(),
                        constraints=objective.failed_constraints(),
                        record=TrialRecord.from_attrs(
                            {**attrs, "failure": "forbidden", "metrics": {}}
                        ),
                    )
                else:
                    attrs["metrics"]["output_throughput"] = value * noise
                    outcome = TrialOutcome(
                        values=objective.values(attrs["metrics"]),
                        constraints=objective.constraints(attrs["metrics"]),
                        record=TrialRecord.from_attrs(attrs),
                    )
                entry = Entry(outcome.values, outcome.constraints, outcome.record.to_attrs())
                path = journal.save(trial._trial_id, number=trial.number, outcome=entry)
                t3 = time.perf_counter()
                finish_trial(study, trial, outcome, constraint_keys=objective.constraint_keys)
                journal.discard(trial._trial_id)
                assert not path.exists()
                t4 = time.perf_counter()
                done = len(
                    study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                )
                if mode == "before":  # the old _best: every completed trial, every time
                    scored = [
                        (t.values[0], t.number)
                        for t in study.get_trials(
                            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
                        )
                        if feasible(t)
                    ]
                    best = max(scored, key=lambda s: (s[0], -s[1])) if scored else None
                else:
                    if outcome.feasible and outcome.failure is None:
                        cur = state["incumbent"]
                        if cur is None or outcome.values[0] > cur[0]:
                            state["incumbent"] = (outcome.values[0], trial.number)
                    best = state["incumbent"]
                assert done == i + 1 and (best is None or best[0] > 0)
                t5 = time.perf_counter()
                for name, dt in (
                    ("ask", t1 - t0),
                    ("suggest + parameters", t2 - t1),
                    ("journal write", t3 - t2),
                    ("store + journal remove", t4 - t3),
                    ("count + incumbent", t5 - t4),
                    ("all", t5 - t0),
                ):
                    buckets[name].append(1000 * dt)
        print(f"tuner work per trial, {n} trials, both modes alternating trial by trial (ms):")
        head = ("step", "before mean", "after mean", "ratio", "before p50", "after p50")
        print("{:26s} {:>12s} {:>11s} {:>7s} {:>11s} {:>10s}".format(*head))
        for name in timings["before"]:
            b, a = timings["before"][name], timings["after"][name]
            print(
                f"{name:26s} {statistics.fmean(b):>12.1f} {statistics.fmean(a):>11.1f} "
                f"{statistics.fmean(b) / max(statistics.fmean(a), 1e-9):>6.1f}x "
                f"{statistics.median(b):>11.1f} {statistics.median(a):>10.1f}"
            )
        for part in (slice(0, n // 4), slice(3 * n // 4, n)):
            before = statistics.fmean(timings["before"]["all"][part])
            after = statistics.fmean(timings["after"]["all"][part])
            print(
                f"  trials {part.start}-{part.stop - 1}: before {before:.1f} ms, "
                f"after {after:.1f} ms ({before / after:.1f}x)"
            )


def _template_attrs() -> dict[str, Any]:
    """What a measured trial stores (the size and number of attributes matter)."""
    dist = {"mean": 14.0, "p50": 13.5, "p90": 15.0, "p99": 18.0}
    services = {
        name: {
            "command": f"env CUDA_VISIBLE_DEVICES=0,1,2,3 python -m autotune.sim.server --{name} "
            + "x " * 60,
            "argv": ["python", "-m", "autotune.sim.server"] + ["--flag", "value"] * 20,
            "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_PROTO": "LL"},
            "unset_env": [],
            "fingerprint": "0123456789abcdef",
            "depends_on": [],
            "ready_timeout_s": 60.0,
            "workdir": None,
            "health_url": "http://127.0.0.1:30000/health",
        }
        for name in ("prefill", "decode", "router")
    }
    return {
        "is_baseline": False,
        "deployment": "sim-dsv4-flash-pd",
        "failure": None,
        "reason": None,
        "reused_from": None,
        "phase_seconds": {"restart": 0.6, "probe": 0.07, "warmup": 0.4, "measure": 0.7},
        "services": services,
        "restarted": ["decode", "router"],
        "effective": {n: {f"arg_{i}": i for i in range(60)} for n in ("prefill", "decode")},
        "overrides": [],
        "sim_speedup": 8.0,
        "metrics": {
            "output_throughput": 0.0,
            "total_throughput": 0.0,
            "request_throughput": 0.0,
            "ttft_ms": dist,
            "tpot_ms": dist,
            "itl_ms": dist,
            "e2e_ms": dist,
            "error_rate": 0.0,
            "goodput": 0.0,
            "completed": 32,
            "failed": 0,
            "duration_s": 4.5,
            "errors": {},
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--variants",
        default="shipped",
        help="shipped, fixed32, fixed128, fixed-eq, adaptive, adaptive-noabort (comma-separated)",
    )
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.05, help="adaptive: target_rel_ci")
    parser.add_argument("--eq-requests", type=int, default=128, help="fixed-eq: requests")
    parser.add_argument("--overhead", type=int, default=0, metavar="N")
    parser.add_argument(
        "--keep", type=Path, default=None, help="run in this directory and keep the studies"
    )
    args = parser.parse_args()
    if args.overhead:
        overhead_replay(args.overhead, seed=args.seed or 0)
        return 0
    variants = [v for v in args.variants.split(",") if v]
    seed = args.seed if args.seed is not None or len(variants) == 1 else 0
    run_variants(variants, args.trials, args.chunk, seed, args.target, args.eq_requests, args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
