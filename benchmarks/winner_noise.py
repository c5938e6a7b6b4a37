"""How often is a single-run winner not the true best, and does re-measuring the top-k help?

Two steps:

``calibrate``: the same few configurations (the model's optimum and two near it) are
measured again and again on the real simulated deployment, every time from freshly started
services (each process draws its own speed: ``sim_noise``), through the tuner's own code
path (``TrialStep.evaluate``: restart, correctness probe, warm-up, measure). Gives the
run-to-run noise of one measurement (relative SD over restarts), the part of it that is
within one run (two loads on the same processes), the bias against the model and the time
one measurement takes, for each load variant (the study's fixed load, longer or adaptive).

``simulate``: studies are replayed on the pure performance model
(``autotune.sim.perf_model.expected_output_throughput`` of the configuration the servers
parse; the same TPE sampler, forbidden combinations and duplicates as the loop), with a
measurement = model value x lognormal noise of the calibrated size. For each study the
set of configurations it evaluated is then measured ``--replays`` more times at random,
and the winner is picked (a) from one run each, (b) after re-measuring the top-k ``r``
times and ranking by the lower 95% confidence bound (what ``autotune best`` does). Reports
how often the winner is not the best evaluated configuration and the expected regret
(how much slower than the best it is, in the model).

    .venv/bin/python benchmarks/winner_noise.py calibrate --restarts 8 --out /tmp/calib.json
    .venv/bin/python benchmarks/winner_noise.py simulate --calibration /tmp/calib.json
    .venv/bin/python benchmarks/winner_noise.py all --restarts 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.results import t975  # noqa: E402
from autotune.sim import perf_model as pm  # noqa: E402
from autotune.sim.levers import pd_configs  # noqa: E402
from autotune.sim.optimum import true_optimum  # noqa: E402
from autotune.space import SearchSpace, load_space  # noqa: E402
from autotune.space.model import Value  # noqa: E402
from autotune.study.definition import StudyDefinition, load_study_definition  # noqa: E402
from autotune.study.samplers import make_sampler  # noqa: E402

STUDY_FILE = REPO / "studies" / "dsv4-flash-sim.yaml"
VARIANTS: dict[str, dict[str, Any]] = {
    "fixed32": {"requests": 32, "target_rel_ci": None},
    "fixed64": {"requests": 64, "target_rel_ci": None},
    "fixed128": {"requests": 128, "target_rel_ci": None},
    "ci10": {"requests": 32, "target_rel_ci": 0.10},
    "ci5": {"requests": 32, "target_rel_ci": 0.05},
}
"""Load variants: changes to the study's ``load`` (the bundled study measures 32 requests)."""


# ------------------------------------------------------------------------ the model


def true_throughput(space: SearchSpace, config: Mapping[str, object], load: Any) -> float | None:
    """Model output tok/s of ``config`` at the study's load; None when it cannot serve
    (start-up failure) or serves wrong text (the correctness probe rejects it).

    ``pd_configs`` gives the configurations the prefill and decode servers parse from the
    rendered command lines (``tests/sim``: ``parse_config(*levers_to_command(l, mode=m)) ==
    config_from_levers(l, mode=m)``).
    """
    pre, dec = pd_configs(space.complete(config))
    for server in (pre, dec):
        if pm.startup_failure(server) is not None:
            return None
    if pm.serves_wrong_text(dec):
        return None
    value = pm.expected_output_throughput(
        dec,
        prefill=pre,
        concurrency=load.concurrency,
        input_len=load.input_len,
        output_len=load.output_len,
    )
    return value if value > 0 else None


def calibration_configs(space: SearchSpace, load: Any) -> dict[str, dict[str, Value]]:
    """The model's optimum and two configurations a few percent below it."""
    opt = true_optimum(
        concurrency=load.concurrency, input_len=load.input_len, output_len=load.output_len
    )
    best = space.complete(opt.levers)
    return {
        "optimum": best,
        "no-speculative": space.complete({**best, "speculative": "off"}),
        "no-direct-swa-kv": space.complete({**best, "sm120_direct_swa_kv": False}),
    }


# ------------------------------------------------------------------------ calibrate


@contextmanager
def scratch_tuner(definition: StudyDefinition, directory: Path) -> Iterator[Any]:
    """A ``Tuner`` on a throw-away SQLite study in ``directory``, which is the working
    directory while it is open; its services are stopped when it closes. No early abort:
    every measurement runs its whole load."""
    from autotune.study.runner import Tuner

    cwd = Path.cwd()
    os.chdir(directory)
    tuner = Tuner(
        definition=definition.model_copy(update={"early_abort": None}),
        study_name="scratch",
        storage_url=f"sqlite:///{directory / 'scratch.db'}",
        run_dir=directory / "run",
    )
    try:
        yield tuner
    finally:
        tuner.launcher.stop_all()
        tuner.launcher.close()
        os.chdir(cwd)


def evaluate(tuner: Any, config: Mapping[str, object], load: Any, *, fresh: bool) -> Any:
    """``config`` measured by a :func:`scratch_tuner` with ``load`` (the study's, changed),
    on freshly started services or on those of the last measurement; the trial outcome."""
    tuner.definition = tuner.definition.model_copy(update={"load": load})
    tuner.pipeline.load = tuner._load_spec()
    return tuner.trial_step.evaluate(config, is_baseline=False, fresh=fresh)


def calibrate(restarts: int, variants: Sequence[str], out: Path | None) -> dict[str, Any]:
    """Measure each calibration configuration ``restarts`` times from fresh processes."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    base = load_study_definition(STUDY_FILE)
    space = load_space(base.resolve(base.space))
    configs = calibration_configs(space, base.load)
    model = {name: true_throughput(space, c, base.load) for name, c in configs.items()}
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="autotune-noise-") as tmp,
        scratch_tuner(base, Path(tmp)) as tuner,
    ):
        for rep in range(restarts):
            for name, config in configs.items():
                for i, variant in enumerate(variants):
                    load = base.load.model_copy(update=VARIANTS[variant])
                    # The first variant restarts every service; the others (and the
                    # second run of the first) reuse those processes: in-run noise.
                    for again in (0, 1) if i == 0 else (0,):
                        t0 = time.perf_counter()
                        outcome = evaluate(tuner, config, load, fresh=i == 0 and again == 0)
                        wall = time.perf_counter() - t0
                        phases = outcome.attrs.get("phase_seconds", {})
                        metrics = outcome.attrs.get("metrics") or {}
                        row = {
                            "config": name,
                            "restart": rep,
                            "variant": variant,
                            "same_process": bool(again),
                            "throughput": metrics.get("output_throughput"),
                            "failure": outcome.failure,
                            "completed": metrics.get("completed"),
                            "warmup_s": phases.get("warmup", 0.0),
                            "measure_s": phases.get("measure", 0.0),
                            "wall_s": wall,
                        }
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    summary = summarize_calibration(rows, model, variants)
    result = {"model": model, "rows": rows, "summary": summary}
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
    return result


def summarize_calibration(
    rows: list[dict[str, Any]], model: Mapping[str, float | None], variants: Sequence[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in variants:
        fresh = [r for r in rows if r["variant"] == variant and not r["same_process"]]
        groups: dict[str, list[float]] = {}
        for r in fresh:
            if r["throughput"]:
                groups.setdefault(r["config"], []).append(float(r["throughput"]))
        ss, df = 0.0, 0
        per_config = {}
        for name, values in groups.items():
            mean = statistics.fmean(values)
            ss += sum((v / mean - 1) ** 2 for v in values)
            df += len(values) - 1
            per_config[name] = {
                "n": len(values),
                "mean": mean,
                "rel_sd": statistics.stdev(values) / mean if len(values) > 1 else None,
                "vs_model": mean / expected if (expected := model.get(name)) else None,
            }
        pairs: dict[tuple[str, int], list[float]] = {}
        for r in rows:
            if r["variant"] == variant and r["throughput"]:
                pairs.setdefault((r["config"], r["restart"]), []).append(float(r["throughput"]))
        diffs = [(a - b) / ((a + b) / 2) for a, b in (v for v in pairs.values() if len(v) == 2)]
        out[variant] = {
            "rel_sd": math.sqrt(ss / df) if df else None,
            "df": df,
            "in_run_rel_sd": math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs)))
            if diffs
            else None,
            "median_measure_s": statistics.median(r["measure_s"] for r in fresh) if fresh else None,
            "median_wall_s": statistics.median(r["wall_s"] for r in fresh) if fresh else None,
            "per_config": per_config,
        }
    return out


def print_calibration(result: Mapping[str, Any]) -> None:
    print("\nrun-to-run noise of one measurement (fresh processes each time):")
    head = ("variant", "rel SD", "df", "in-run SD", "measure s")
    print("{:10s} {:>8s} {:>4s} {:>10s} {:>10s}  per config".format(*head))
    for variant, s in result["summary"].items():
        per = ", ".join(
            f"{k} {v['mean']:.0f} ({100 * (v['rel_sd'] or 0):.1f}%, {v['vs_model']:.3f}x model)"
            for k, v in s["per_config"].items()
        )
        sd = f"{100 * s['rel_sd']:.2f}%" if s["rel_sd"] is not None else "n/a"
        inrun = f"{100 * s['in_run_rel_sd']:.2f}%" if s["in_run_rel_sd"] is not None else "-"
        med = s["median_measure_s"] or 0.0
        print(f"{variant:10s} {sd:>8s} {s['df']:>4d} {inrun:>10s} {med:>10.2f}  {per}")


# ------------------------------------------------------------------------ simulate


@dataclass
class Evaluated:
    """Distinct feasible configurations a study measured, with their model values."""

    seed: int
    values: np.ndarray


def replay_study(seed: int, trials: int, noise: float, space: SearchSpace, load: Any) -> Evaluated:
    """One study on the pure model: the loop's sampler, forbidden combinations and
    duplicate reuse, a noisy measurement per launched configuration."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    study = optuna.create_study(direction="maximize", sampler=make_sampler("tpe", seed=seed))
    study.enqueue_trial(space.baseline_params())
    rng = np.random.default_rng(seed + 1)
    seen: dict[str, float] = {}
    feasible: dict[str, float] = {}
    for _ in range(trials):
        trial = study.ask()
        config = space.suggest(trial)
        if space.violations(config):
            study.tell(trial, 0.0)
            continue
        key = space.config_key(config)
        if key not in seen:
            value = true_throughput(space, config, load)
            measured = 0.0 if value is None else value * math.exp(rng.normal(0.0, noise))
            seen[key] = measured
            if value is not None:
                feasible[key] = value
        study.tell(trial, seen[key])
    return Evaluated(seed=seed, values=np.array(sorted(feasible.values())))


@dataclass(frozen=True)
class Rule:
    name: str
    top_k: int = 0
    repeats: int = 0


def select(
    values: np.ndarray, rule: Rule, noise: float, rng: np.random.Generator, n: int
) -> np.ndarray:
    """Indices of the winner in ``n`` independent replays of measuring ``values``."""
    m = len(values)
    single = values[None, :] * np.exp(rng.normal(0.0, noise, size=(n, m)))
    if rule.top_k <= 0 or rule.repeats <= 0:
        return np.argmax(single, axis=1)
    k = min(rule.top_k, m)
    top = np.argsort(-single, axis=1)[:, :k]  # (n, k) top-k by their single run
    first = np.take_along_axis(single, top, axis=1)
    extra = values[top][:, :, None] * np.exp(rng.normal(0.0, noise, size=(n, k, rule.repeats)))
    runs = np.concatenate([first[:, :, None], extra], axis=2)  # (n, k, 1 + r)
    means = runs.mean(axis=2)
    rel = runs / means[:, :, None] - 1.0
    df = k * rule.repeats
    sd = np.sqrt((rel**2).sum(axis=(1, 2)) / df)  # pooled relative SD per replay
    t = t975(df)
    # Every configuration's lower 95% bound with the pooled noise: one run outside the
    # top-k, 1 + r runs inside it (autotune.results.config_estimates).
    lower = single * (1.0 - t * sd[:, None])
    rows = np.arange(n)[:, None]
    lower[rows, top] = means * (1.0 - t * sd[:, None] / math.sqrt(1 + rule.repeats))
    return np.argmax(lower, axis=1)


def real_studies(paths: Sequence[Path]) -> list[Evaluated]:
    """The configurations real studies measured (SQLite files of ``autotune run``)."""
    base = load_study_definition(STUDY_FILE)
    space = load_space(base.resolve(base.space))
    out = []
    for seed, path in enumerate(paths):
        storage = f"sqlite:///{path}"
        name = optuna.get_all_study_summaries(storage)[0].study_name
        study = optuna.load_study(study_name=name, storage=storage)
        values = {}
        for t in study.get_trials(deepcopy=False):
            config = t.user_attrs.get("config")
            if t.values and config and t.user_attrs.get("reused_from") is None:
                value = true_throughput(space, config, base.load)
                if value is not None:
                    values[space.config_key(config)] = value
        out.append(Evaluated(seed=1000 + seed, values=np.array(sorted(values.values()))))
    return out


def replay_studies(studies: int, trials: int, noise: float) -> list[Evaluated]:
    """``studies`` loop replays (seeds 0..) whose measurements carry ``noise``."""
    base = load_study_definition(STUDY_FILE)
    space = load_space(base.resolve(base.space))
    return [replay_study(seed, trials, noise, space, base.load) for seed in range(studies)]


def simulate(
    noise: float, evaluated: Sequence[Evaluated], *, replays: int, rules: Sequence[Rule]
) -> list[dict[str, Any]]:
    """Winner selection over the configurations each study evaluated, at ``noise``."""
    out = []
    for rule in rules:
        wrong, regrets, big = 0, [], 0
        for ev in evaluated:
            rng = np.random.default_rng([ev.seed, 99, rule.top_k, rule.repeats])
            win = select(ev.values, rule, noise, rng, replays)
            best = ev.values.max()
            regret = (best - ev.values[win]) / best
            wrong += int((regret > 1e-9).sum())
            big += int((regret > 0.01).sum())
            regrets.append(regret)
        all_regret = np.concatenate(regrets)
        total = len(all_regret)
        out.append(
            {
                "rule": rule.name,
                "extra_measurements": rule.top_k * rule.repeats,
                "not_best": wrong / total,
                "regret_over_1pct": big / total,
                "mean_regret": float(all_regret.mean()),
                "p95_regret": float(np.percentile(all_regret, 95)),
            }
        )
    return out


def describe(
    evaluated: Sequence[Evaluated], trials: int, noise: float, replays: int, real: bool = False
) -> None:
    sizes = [len(ev.values) for ev in evaluated]
    near = [int((ev.values >= 0.97 * ev.values.max()).sum()) for ev in evaluated]
    if real:
        print(
            f"\n{len(evaluated)} real studies: {statistics.median(sizes):.0f} distinct feasible "
            f"configurations measured, {statistics.median(near):.0f} within 3% of the best "
            f"(medians); each study's winner picked in {replays} random measurement replays"
        )
        return
    print(
        f"\n{len(evaluated)} studies x {trials} trials replayed on the model with "
        f"{100 * noise:.1f}% measurement noise: {statistics.median(sizes):.0f} distinct "
        f"feasible configurations measured, {statistics.median(near):.0f} of them within 3% "
        "of the best (medians); "
        f"each study's winner picked in {replays} random measurement replays"
    )


def print_simulation(rows: Sequence[Mapping[str, Any]], noise: float) -> None:
    print(f"\nwinner selection at {100 * noise:.1f}% run-to-run noise:")
    head = ("rule", "extra runs", "not best", ">1% worse", "mean regret", "p95 regret")
    print("{:34s} {:>10s} {:>9s} {:>10s} {:>12s} {:>11s}".format(*head))
    for r in rows:
        print(
            f"{r['rule']:34s} {r['extra_measurements']:>10d} {100 * r['not_best']:>8.1f}% "
            f"{100 * r['regret_over_1pct']:>9.1f}% {100 * r['mean_regret']:>11.2f}% "
            f"{100 * r['p95_regret']:>10.2f}%"
        )


DEFAULT_RULES = (
    Rule("single run (no re-measurement)"),
    Rule("re-measure top-3 x1", 3, 1),
    Rule("re-measure top-3 x2", 3, 2),
    Rule("re-measure top-5 x1", 5, 1),
    Rule("re-measure top-5 x2", 5, 2),
    Rule("re-measure top-10 x1", 10, 1),
    Rule("re-measure top-10 x3", 10, 3),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("calibrate", "simulate", "all"))
    parser.add_argument("--restarts", type=int, default=8)
    parser.add_argument("--variants", default="fixed32,ci5")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--calibration", type=Path, default=None)
    parser.add_argument(
        "--noise", type=float, nargs="*", default=None, help="relative SD (0.05 = 5%%)"
    )
    parser.add_argument(
        "--study-noise", type=float, default=None, help="noise of the replayed studies' runs"
    )
    parser.add_argument(
        "--from-study",
        type=Path,
        nargs="*",
        default=None,
        help="judge the configurations these studies (SQLite files) measured",
    )
    parser.add_argument("--studies", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--replays", type=int, default=2000)
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    noises: dict[str, float] = {}
    if args.step in ("calibrate", "all"):
        result = calibrate(args.restarts, variants, args.out)
        print_calibration(result)
        noises = {v: s["rel_sd"] for v, s in result["summary"].items() if s["rel_sd"]}
    elif args.calibration is not None:
        result = json.loads(args.calibration.read_text())
        print_calibration(result)
        noises = {v: s["rel_sd"] for v, s in result["summary"].items() if s["rel_sd"]}
    if args.noise is not None:
        noises = {f"--noise {n:g}": n for n in args.noise}
    if args.step in ("simulate", "all"):
        if not noises:
            parser.error("simulate needs --noise or --calibration")
        # One set of studies (the loop at the first noise level), judged at every level.
        study_noise = (
            args.study_noise if args.study_noise is not None else next(iter(noises.values()))
        )
        if args.from_study:
            evaluated = real_studies(args.from_study)
            describe(evaluated, 0, study_noise, args.replays, real=True)
        else:
            evaluated = replay_studies(args.studies, args.trials, study_noise)
            describe(evaluated, args.trials, study_noise, args.replays)
        for variant, noise in noises.items():
            print(f"\n== noise of one measurement: {variant} ==")
            print_simulation(
                simulate(noise, evaluated, replays=args.replays, rules=DEFAULT_RULES), noise
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
