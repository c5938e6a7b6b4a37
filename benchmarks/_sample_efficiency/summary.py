"""Figures over the runs (trials to a level, best at a checkpoint, crash-awareness), random
search's odds, every run over worker processes and the report ``--json`` writes."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import random
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna

from .runs import MULTIVARIATE_TPE, PLAIN_TPE, Run, run_one
from .surfaces import Surface, load_surface

LEVELS = (0.90, 0.95, 0.99)
CHECKPOINTS = (25, 50, 100, 200)
LAUNCH_CHECKPOINTS = (8, 16, 32)
"""Restart budgets of GPU studies (16 is the H200 side-by-side's): forbidden and reused trials
are free there, so a sampler is judged by the best found after N launches."""


# ---------------------------------------------------------------------------- summaries


def trials_to(run: Run, level: float, optimum: float) -> int | None:
    """First trial (1-based, the baseline is trial 1) whose incumbent is within ``level``
    of the optimum; None when the run never got there."""
    for i, value in enumerate(run.incumbent):
        if value >= level * optimum * (1 - 1e-9):
            return i + 1
    return None


def launches_to(run: Run, level: float, optimum: float) -> int | None:
    """Launches (restarts) spent until ``trials_to``: forbidden and duplicate trials are free."""
    reached = trials_to(run, level, optimum)
    if reached is None:
        return None
    return sum(1 for k in run.kinds[:reached] if k == "launch")


def best_at(run: Run, n: int, optimum: float) -> float | None:
    """Incumbent after ``n`` trials, in % of the optimum (None past the run's length)."""
    if n > len(run.incumbent):
        return None
    return 100.0 * run.incumbent[n - 1] / optimum


def best_at_launches(run: Run, n: int, optimum: float) -> float | None:
    """Incumbent once ``n`` launches were spent, in % of the optimum (None when the run
    launched fewer)."""
    spent = 0
    for i, kind in enumerate(run.kinds):
        spent += kind == "launch"
        if spent == n:
            return 100.0 * run.incumbent[i] / optimum
    return None


def _spread(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(arr)),
        "q1": float(np.percentile(arr, 25)),
        "q3": float(np.percentile(arr, 75)),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def summarize(runs: Sequence[Run], optimum: float) -> dict[str, Any]:
    """Figures over the seeds of one (surface, sampler). A seed that never reached a level
    counts as budget + 1 trials (so a median above the budget reads "> budget")."""
    budget = len(runs[0].incumbent)
    out: dict[str, Any] = {"seeds": len(runs), "trials": budget}
    for level in LEVELS:
        reached = [trials_to(r, level, optimum) for r in runs]
        launches = [launches_to(r, level, optimum) for r in runs]
        out[f"to_{round(level * 100)}"] = {
            **_spread([budget + 1 if n is None else n for n in reached]),
            "not_reached": sum(n is None for n in reached),
            "launches": _spread([budget + 1 if n is None else n for n in launches]),
        }
    out["best_at"] = {
        str(n): _spread([best_at(r, n, optimum) or 0.0 for r in runs])
        for n in CHECKPOINTS
        if n <= budget
    }
    out["best_at_launches"] = {
        str(n): _spread([v for v in at if v is not None])
        | {"runs": len(at) - at.count(None), "of": len(at)}
        for n in LAUNCH_CHECKPOINTS
        if (at := [best_at_launches(r, n, optimum) for r in runs]).count(None) < len(at)
    }
    counts: dict[str, list[float]] = {
        k: [] for k in ("forbidden", "duplicates", "launches", "crashes", "near_crash")
    }
    known = proposals = 0
    causes: dict[str, int] = {}
    for r in runs:
        launched = [i for i, k in enumerate(r.kinds) if k == "launch"]
        crashes = [i for i in launched if r.failures[i] is not None]
        counts["forbidden"].append(r.kinds.count("forbidden"))
        counts["duplicates"].append(r.kinds.count("duplicate"))
        counts["launches"].append(len(launched))
        counts["crashes"].append(len(crashes))
        counts["near_crash"].append(sum(r.near_crash))
        first = crashes[0] if crashes else len(r.kinds)
        after = [i for i in range(first + 1, len(r.kinds)) if r.kinds[i] != "forbidden"]
        proposals += len(after)
        known += sum(r.known_cause[i] for i in after)
        for i in crashes:
            cause = r.failures[i] or "?"
            causes[cause] = causes.get(cause, 0) + 1
    out["mean"] = {k: float(np.mean(v)) for k, v in counts.items()}
    out["crash_causes"] = causes
    out["known_cause_share"] = known / proposals if proposals else 0.0
    out["crash_share"] = sum(counts["crashes"]) / max(1.0, sum(counts["launches"]))
    out["forbidden_launched"] = sum(r.forbidden_launched for r in runs)
    tail = [ms for r in runs for ms in r.sampler_ms[max(0, budget - 20) :]]
    out["sampler_ms_last20"] = {"mean": float(np.mean(tail)), "p95": float(np.percentile(tail, 95))}
    out["sampler_ms_mean"] = float(np.mean([ms for r in runs for ms in r.sampler_ms]))
    out["seconds_per_run"] = float(np.mean([r.seconds for r in runs]))
    return out


def random_odds(surface: Surface, *, draws: int, seed: int = 0) -> dict[str, float]:
    """P(one random-search trial is within 90/95/99% of the optimum), by Monte Carlo over
    ``SearchSpace.random_config`` (RandomSampler's distribution; forbidden draws count as
    misses), and the median trials random search needs: 1 + ln 0.5 / ln(1 - p)."""
    rng = random.Random(seed)
    score = surface.fast_evaluate or surface.evaluate
    hits = dict.fromkeys(LEVELS, 0)
    for i in range(draws):
        config = surface.space.random_config(rng)
        if surface.space.violations(config):
            continue
        launch = score(config)
        if i < 200 and score is not surface.evaluate and surface.evaluate(config) != launch:
            raise AssertionError(f"fast and full evaluation differ on {config}")
        if launch.failure is None:
            for level in LEVELS:
                hits[level] += launch.throughput >= level * surface.optimum * (1 - 1e-9)
    out: dict[str, float] = {"draws": float(draws)}
    for level in LEVELS:
        p = hits[level] / draws
        name = str(round(level * 100))
        out[f"p{name}"] = p
        out[f"median_trials_{name}"] = (
            1.0 + math.ceil(math.log(0.5) / math.log(1.0 - p)) if 0 < p < 1 else math.inf
        )
    return out


# ---------------------------------------------------------------------------- driver


def _task(args: tuple[str, str, int, int, float, str, bool]) -> dict[str, Any]:
    surface_name, sampler, seed, trials, noise, objective, surface_noise = args
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    surface = load_surface(surface_name, objective=objective)
    run = run_one(surface, sampler, seed, trials, noise=noise, surface_noise=surface_noise)
    return dataclasses.asdict(run)


def run_all(
    surfaces: Sequence[str],
    samplers: Sequence[str],
    seeds: Sequence[int],
    trials: int,
    *,
    noise: float = 0.0,
    surface_noise: bool = False,
    objective: str = "throughput",
    workers: int = 1,
) -> dict[str, dict[str, list[Run]]]:
    """Every (surface, sampler, seed) run, over ``workers`` processes."""
    for name in surfaces:  # optima once, in the parent (forked workers inherit the caches)
        load_surface(name, objective=objective)
    tasks = [
        (s, p, seed, trials, noise, objective, surface_noise)
        for s in surfaces
        for p in samplers
        for seed in seeds
    ]
    slow = ("gp", "rfbo", "tpe", PLAIN_TPE, MULTIVARIATE_TPE, "nsga2")
    tasks.sort(key=lambda t: slow.index(t[1]) if t[1] in slow else len(slow))  # slow first
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_task, tasks, chunksize=1)
    else:
        results = [_task(t) for t in tasks]
    out: dict[str, dict[str, list[Run]]] = {s: {p: [] for p in samplers} for s in surfaces}
    for res in results:
        out[res["surface"]][res["sampler"]].append(Run(**res))
    for by_sampler in out.values():
        for runs in by_sampler.values():
            runs.sort(key=lambda r: r.seed)
    return out


def build_report(
    runs: Mapping[str, Mapping[str, list[Run]]],
    *,
    trials: int,
    seeds: Sequence[int],
    noise: float,
    objective: str,
    odds_draws: int,
    surface_noise: bool = False,
) -> dict[str, Any]:
    """Everything ``--json`` writes: per surface, the optimum, random search's odds and the
    summary of every sampler (and, for generated surfaces, the level and needle fraction)."""
    report: dict[str, Any] = {
        "trials": trials,
        "seeds": list(seeds),
        "noise": noise,
        "surface_noise": surface_noise,
        "objective": objective,
        "surfaces": {},
    }
    for name, by_sampler in runs.items():
        surface = load_surface(name, objective=objective)
        report["surfaces"][name] = {
            "optimum": surface.optimum,
            "optimum_config": surface.optimum_config,
            "description": surface.description,
            "level": surface.level,
            "needle_fraction": surface.needle_fraction,
            "random_odds": random_odds(surface, draws=odds_draws) if odds_draws else {},
            "samplers": {s: summarize(rs, surface.optimum) for s, rs in by_sampler.items() if rs},
        }
    return report
