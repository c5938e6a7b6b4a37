"""Warm start, measured: a study on a surface, then on an "upgraded" version of it, from scratch
vs warm-started from the first study.

For each seed: study A runs on the surface (``sample_efficiency.run_one``: the tuning loop's
own suggest / forbidden / reuse / ``finish_trial`` path, the default sampler); then the
surface is upgraded (``perturb``: every lever value gets a seeded speed factor, as a new
engine release or driver makes some settings faster and others slower; crashes stay where
they were, the hardware did not change) and study B runs on it twice with the same seed:
from scratch, and warm-started from A through the product's own code
(``autotune.study.warm_start.plan_warm_start`` + ``apply_warm_start``: A's top configurations
translated and enqueued after the baseline, A's failed launches carried as evidence), called
where the runner calls it, before B's first trial. Reported: trials (B's own; carried ones
are not trials) to 90/95/99% of the upgraded surface's optimum, median [IQR], and the best
found after 5/10/25 trials.

The upgrade is one seam, ``surfaces_for(name, seed) -> (surface, upgraded)``: the bundled
synthetic surfaces are upgraded by :func:`perturb` below, whose optimum is exact (every
configuration's base value comes from the surface's vectorised enumeration,
``_grid``/``_outcomes`` of ``benchmarks/surfaces/*.py``, and only the configurations the
largest factor could lift above the old optimum's new value are re-scored one by one);
``gen-LEVEL`` surfaces take ``generate(seed, level=)`` and ``perturb(surface, seed)`` from
``--generated benchmarks/surfaces/generated.py`` (the generator's own upgrade: effects
shifted, the OOM edge moved, a needle moved, a choice gained or lost, so the translation
has work to do).

Usage::

    .venv/bin/python benchmarks/warm_start.py --seeds 8 --trials-a 100 --trials-b 100 \
        --workers 2 --json reports/warm_start.json
    .venv/bin/python benchmarks/warm_start.py --surfaces gen-easy,gen-medium,gen-hard \
        --generated benchmarks/surfaces/generated.py
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import multiprocessing
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_efficiency import (  # noqa: E402
    LEVELS,
    Launch,
    Run,
    Surface,
    _load_module,
    _spread,
    best_at,
    load_surface,
    run_one,
    surface_of,
    trials_to,
)

from autotune.failures import Failure  # noqa: E402
from autotune.results import ranked_estimates  # noqa: E402
from autotune.space import SearchSpace, TrialConfig  # noqa: E402
from autotune.space.model import FloatParam, IntParam, choice_key  # noqa: E402
from autotune.study.warm_start import apply_warm_start, plan_warm_start  # noqa: E402

SURFACES = ("gemm-kernel", "vllm-serving")
SIGMA = 0.04
"""Spread (log scale) of the upgrade's speed factor per lever value."""
MARKS = (5, 10, 25)
FAILURE_NAMES = {"out_of_resources": Failure.config_rejected.value}
"""Synthetic failure classes in the product's terms: a kernel over its shared memory or
registers is refused at launch (the carried failures are the product's classes only)."""

# ---------------------------------------------------------------------------- the upgrade


def _factors(
    space: SearchSpace, seed: int, name: str
) -> tuple[Callable[[Mapping[str, Any]], float], float]:
    """A seeded speed factor of a configuration: exp(sum of one effect per active lever
    value; numeric levers tilt linearly across their (log) range); and its largest value."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    effects: dict[tuple[str, str], float] = {}
    tilts: dict[str, float] = {}
    for param in space.sampled_params:
        if param.choices is not None:
            for choice in param.choices:
                effects[(param.name, choice_key(choice))] = float(rng.normal(0.0, SIGMA))
        else:
            tilts[param.name] = float(rng.normal(0.0, 2 * SIGMA))

    def factor(config: Mapping[str, Any]) -> float:
        total = 0.0
        for param in space.sampled_params:
            if param.name not in config:
                continue
            value = config[param.name]
            if param.choices is not None:
                total += effects[(param.name, choice_key(value))]
                continue
            spec = param.spec
            assert isinstance(spec, (IntParam, FloatParam))
            lo, hi, x = float(spec.low), float(spec.high), float(value)
            if spec.log:
                lo, hi, x = math.log(lo), math.log(hi), math.log(x)
            total += tilts[param.name] * ((x - lo) / (hi - lo) - 0.5)
        return math.exp(total)

    bound = sum(
        max(0.0, *(v for (n, _), v in effects.items() if n == p.name))
        if p.choices is not None
        else abs(tilts[p.name]) / 2
        for p in space.sampled_params
    )  # a conditional lever may be inactive (no effect): never below 0
    return factor, math.exp(bound)


def perturb(surface: Surface, seed: int) -> Surface:
    """``surface`` after a seeded upgrade: the same space, the same crash regions, every
    healthy configuration's score times its factor (:func:`_factors`); the exact optimum."""
    factor, bound = _factors(surface.space, seed, surface.name)

    def evaluate(config: TrialConfig) -> Launch:
        launch = surface.evaluate(config)
        if launch.failure is not None:
            return launch
        return dataclasses.replace(launch, throughput=launch.throughput * factor(config))

    module = _load_module(surface.name)
    grid = module._grid()
    values, _ = module._outcomes(grid)
    anchor = surface.optimum * factor(surface.optimum_config)
    candidates = np.flatnonzero(values * bound >= anchor * (1 - 1e-9))
    best, best_config = anchor, dict(surface.optimum_config)
    for i in candidates:
        config = module._config(grid, int(i))
        value = float(values[i]) * factor(config)
        if value > best:
            best, best_config = value, config
    return Surface(
        name=surface.name,
        space=surface.space,
        objective=surface.objective,
        evaluate=evaluate,
        optimum=best,
        optimum_config=best_config,
        description=f"{surface.description} (upgraded, seed {seed})",
    )


def _product_failures(surface: Surface) -> Surface:
    def evaluate(config: TrialConfig) -> Launch:
        launch = surface.evaluate(config)
        if launch.failure in FAILURE_NAMES:
            return dataclasses.replace(launch, failure=FAILURE_NAMES[launch.failure])
        return launch

    return dataclasses.replace(surface, evaluate=evaluate)


def _load_file(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def surfaces_for(name: str, seed: int, generated: str | None) -> tuple[Surface, Surface]:
    """(the surface, its upgrade) for one seed. ``gen-LEVEL`` names take both from the
    generator file ``generated`` (``generate(seed, level=)``, ``perturb(surface, seed)``);
    the bundled surfaces are upgraded by :func:`perturb` above."""
    if name.startswith("gen-"):
        if generated is None:
            raise SystemExit(f"{name}: give --generated PATH/generated.py")
        module = _load_file(generated, "generated_surfaces")
        base = module.generate(seed, level=name.removeprefix("gen-"))
        return surface_of(base), surface_of(module.perturb(base, seed))
    base = _product_failures(load_surface(name))
    return base, _product_failures(perturb(base, seed))


# ---------------------------------------------------------------------------- one seed


def run_seed(
    name: str, seed: int, trials_a: int, trials_b: int, top: int, generated: str | None
) -> dict[str, Any]:
    """Study A on the surface, then B on its upgrade from scratch and warm-started."""
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    base, upgraded = surfaces_for(name, seed, generated)
    studies: list[optuna.Study] = []
    first = run_one(base, "tpe", seed, trials_a, on_study=studies.append)
    source = studies[0]
    plan = plan_warm_start(
        source, space=upgraded.space, top=top, enqueued=[upgraded.space.baseline_params()]
    )

    def warm(study: optuna.Study) -> None:
        apply_warm_start(study, plan, space=upgraded.space, objective=upgraded.objective)

    seed_b = seed + 100_000
    scratch = run_one(upgraded, "tpe", seed_b, trials_b)
    started = run_one(upgraded, "tpe", seed_b, trials_b, on_study=warm)
    old_best = max(first.incumbent) if first.incumbent else 0.0
    ranked = ranked_estimates(source)  # A's winner, as `autotune best` picks it
    old_config = upgraded.space.translate(ranked[0].trial.params).params if ranked else None
    return {
        "surface": name,
        "seed": seed,
        "optimum": upgraded.optimum,
        "old_optimum": base.optimum,
        "old_winner_now": (
            upgraded.evaluate(upgraded.space.complete(old_config)).throughput / upgraded.optimum
            if old_config is not None
            else None
        ),
        "a_reached": old_best / base.optimum,
        "enqueued": len(plan.enqueue),
        "carried": len(plan.carried),
        "scratch": dataclasses.asdict(scratch),
        "warm": dataclasses.asdict(started),
    }


# ---------------------------------------------------------------------------- report


def summarize(rows: Sequence[Mapping[str, Any]], trials_b: int) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": len(rows), "trials_b": trials_b}
    for mode in ("scratch", "warm"):
        runs = [(Run(**r[mode]), r["optimum"]) for r in rows]
        entry: dict[str, Any] = {}
        for level in LEVELS:
            reached = [trials_to(run, level, opt) for run, opt in runs]
            entry[f"to_{round(level * 100)}"] = {
                **_spread([trials_b + 1 if n is None else n for n in reached]),
                "not_reached": sum(n is None for n in reached),
            }
        entry["best_at"] = {
            str(n): _spread([best_at(run, n, opt) or 0.0 for run, opt in runs])
            for n in MARKS
            if n <= trials_b
        }
        entry["launches"] = float(np.mean([r.kinds.count("launch") for r, _ in runs]))
        entry["crashes"] = float(
            np.mean(
                [
                    sum(1 for k, f in zip(r.kinds, r.failures, strict=True) if k == "launch" and f)
                    for r, _ in runs
                ]
            )
        )
        out[mode] = entry
    out["carried_mean"] = float(np.mean([r["carried"] for r in rows]))
    out["enqueued_mean"] = float(np.mean([r["enqueued"] for r in rows]))
    winners = [r["old_winner_now"] for r in rows if r["old_winner_now"] is not None]
    out["old_winner_now"] = _spread([100 * w for w in winners]) if winners else {}
    out["a_reached"] = _spread([100 * r["a_reached"] for r in rows])
    return out


def _cell(q: Mapping[str, Any], budget: int) -> str:
    def n(x: float) -> str:
        return f">{budget}" if x > budget else f"{x:.0f}"

    text = f"{n(q['median'])} [{n(q['q1'])}-{n(q['q3'])}]"
    return text + (f" ({q['not_reached']} n/r)" if q.get("not_reached") else "")


def markdown(report: Mapping[str, Any]) -> str:
    lines: list[str] = []
    for name, s in report["surfaces"].items():
        budget = int(s["trials_b"])
        lines += [
            f"#### {name}: {s['seeds']} seeds; A {report['trials_a']} trials (reached "
            f"{s['a_reached']['median']:.1f}% of its optimum), B {budget} trials; A's winner "
            f"is {s['old_winner_now'].get('median', float('nan')):.1f}% of the upgraded "
            f"optimum (median); warm start: {s['enqueued_mean']:.1f} configurations "
            f"enqueued, {s['carried_mean']:.1f} failed launches carried",
            "",
            "| B | trials to 90% | trials to 95% | trials to 99% | "
            + " | ".join(f"best @{n}" for n in MARKS if n <= budget)
            + " | launches | crashed |",
            "|---|---|---|---|" + "---|" * len([n for n in MARKS if n <= budget]) + "---|---|",
        ]
        for mode in ("scratch", "warm"):
            e = s[mode]
            cells = [_cell(e[f"to_{round(lv * 100)}"], budget) for lv in LEVELS]
            marks = [
                f"{e['best_at'][str(n)]['median']:.1f}%" for n in MARKS if str(n) in e["best_at"]
            ]
            lines.append(
                f"| {'from scratch' if mode == 'scratch' else 'warm-started'} | "
                + " | ".join(cells + marks)
                + f" | {e['launches']:.1f} | {e['crashes']:.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--surfaces", default=",".join(SURFACES))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--trials-a", type=int, default=60)
    parser.add_argument("--trials-b", type=int, default=60)
    parser.add_argument("--top", type=int, default=5, help="warm_start.top")
    parser.add_argument(
        "--generated",
        default=None,
        help="benchmarks/surfaces/generated.py to take gen-LEVEL surfaces and their upgrade from",
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tasks = [
        (name, seed, args.trials_a, args.trials_b, args.top, args.generated)
        for name in args.surfaces.split(",")
        if name
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    for name in {t[0] for t in tasks if not t[0].startswith("gen-")}:
        load_surface(name)  # optima once, in the parent (forked workers inherit the caches)
    if args.workers > 1:
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            rows = pool.starmap(run_seed, tasks, chunksize=1)
    else:
        rows = [run_seed(*t) for t in tasks]
    report: dict[str, Any] = {
        "trials_a": args.trials_a,
        "trials_b": args.trials_b,
        "top": args.top,
        "sigma": SIGMA,
        "upgrade": "generated.perturb" if args.generated else "benchmarks/warm_start.py:perturb",
        "surfaces": {},
    }
    for name in dict.fromkeys(t[0] for t in tasks):
        report["surfaces"][name] = summarize(
            [r for r in rows if r["surface"] == name], args.trials_b
        )
    report["wall_seconds"] = time.perf_counter() - started
    report["command"] = " ".join(["benchmarks/warm_start.py", *(argv or sys.argv[1:])])
    print(markdown(report))
    print(f"wall: {report['wall_seconds']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**report, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
