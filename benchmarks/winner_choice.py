"""Does the re-measure phase pick the right winner? The policies replayed offline, no servers.

For each surface and noise level, studies of the pure-surface loop are run first
(``benchmarks/sample_efficiency.run_one``: the default sampler, forbidden combinations,
duplicate reuse, crashes; every launch measures the surface's true value x lognormal noise
of sigma ``sigma(config)``: a fixed 3/5/8% here, a surface's own ``noise_sigma`` with
``--noise surface``). Each finished study is then handed to the re-measure phase
``--replays`` times, every re-measurement drawn afresh from the true value x new noise of
the same sigma, under:

* (a) ``none``: no re-measurement, the best single run wins;
* (b) ``fixed top-3 x2``: ``policy: fixed`` with ``top_k: 3, repeats: 2``;
* (c) ``race, budget 6``: ``policy: race`` with the same restart budget (``budget: 6``);
* the race with as many restarts as (b) actually took in the same replay (the fixed policy
  draws its top-3 again after every run, so it takes more than ``top_k x repeats``: up to
  3x);
* and the old default against the race sized by it: ``fixed top-3 x1``, ``race, budget 3``
  and the race with as many restarts as top-3 x1 took.

The policies are the product's own code (``autotune.study.race``: ``FixedPolicy`` and
``RacePolicy`` decide every restart from what is measured, as ``autotune run`` does) and the
winner is picked by ``best``'s rule over all measurements (``autotune.study.race.winner``:
the highest lower 95% bound with the noise pooled over every configuration measured twice
or more; without a repeat, the highest single run). Reported per surface and noise level:
how often the winner is within 2% of the truly best configuration among those the study
measured ("within 2%"), the mean shortfall against it (1 - true(winner) / true(best)), and the
restarts the phase used (mean and max). The replay is generic over a ``Surface`` and a
per-configuration sigma (``replay_study``), so it runs on any surface ``load_surface`` knows.

    .venv/bin/python benchmarks/winner_choice.py --json reports/winner_choice.json   # ~6 min
    .venv/bin/python benchmarks/winner_choice.py --studies-from reports/winner_choice.json
    .venv/bin/python benchmarks/winner_choice.py --seeds 4 --replays 20 --surfaces gemm-kernel

``--budgets 6,12,24,48`` replaces the rules by the race at each of those budgets (beside
none and fixed top-3 x2): how many restarts the 2% target costs at a noise level.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_efficiency import ALL_SURFACES, Surface, load_surface, run_one  # noqa: E402

from autotune.space import TrialConfig  # noqa: E402
from autotune.study.race import Arm, Decision, FixedPolicy, RacePolicy, winner  # noqa: E402

WITHIN = 0.02
"""A winner within this fraction of the truly best measured configuration counts as right."""


class Policy(Protocol):
    def decide(self, arms: Sequence[Arm], *, spent: int) -> Decision: ...


@dataclass(frozen=True)
class Rule:
    name: str
    policy: Policy | None
    """``None``: no re-measurement."""
    matched: FixedPolicy | None = None
    """Race with as many restarts as this fixed policy took in the same replay."""


RULES = (
    Rule("(a) none: best single run", None),
    Rule("(b) fixed top-3 x2", FixedPolicy(top_k=3, repeats=2)),
    Rule("(c) race, budget 6", RacePolicy(budget=6)),
    Rule("race, budget = what (b) took", None, matched=FixedPolicy(top_k=3, repeats=2)),
    Rule("fixed top-3 x1 (old default)", FixedPolicy(top_k=3, repeats=1)),
    Rule("race, budget 3 (= top-3 x1)", RacePolicy(budget=3)),
    Rule("race, budget = what top-3 x1 took", None, matched=FixedPolicy(top_k=3, repeats=1)),
)


@dataclass(frozen=True)
class Measured:
    """One configuration a study launched and measured (feasible)."""

    number: int
    true: float
    first: float
    """The study's own measurement of it (the trial)."""
    sigma: float


@dataclass(frozen=True)
class Finished:
    """A finished study: what it measured, and the truly best of it."""

    surface: str
    noise: str
    seed: int
    configs: tuple[Measured, ...]

    @property
    def best_true(self) -> float:
        return max(c.true for c in self.configs)


def finish_study(
    surface: Surface,
    sigma: Callable[[TrialConfig], float],
    *,
    seed: int,
    trials: int,
    noise: str,
    sampler: str = "tpe",
) -> Finished:
    """Run the pure-surface loop and keep the configurations it launched and measured."""
    run = run_one(surface, sampler, seed, trials, sigma=sigma)
    configs = tuple(
        Measured(number=i, true=run.true_values[i], first=run.observed[i], sigma=run.sigmas[i])
        for i, kind in enumerate(run.kinds)
        if kind == "launch" and run.failures[i] is None and run.true_values[i] > 0
    )
    return Finished(surface=surface.name, noise=noise, seed=seed, configs=configs)


@dataclass(frozen=True)
class Pick:
    winner: int
    restarts: int
    decided: bool = False
    """The policy stopped by itself (the race: leader separated, or the rest within the
    indifference zone; fixed: its plan done) rather than on its budget or limit."""


def replay_study(study: Finished, policy: Policy | None, rng: np.random.Generator) -> Pick:
    """One re-measure phase on a finished study: the policy decides each restart from the
    measurements so far (as ``Remeasurer.run`` does), each re-measurement is the true value
    x fresh noise; the winner is ``best``'s pick from everything measured."""
    by_number = {c.number: c for c in study.configs}
    values = {c.number: [c.first] for c in study.configs}
    repeats: dict[int, set[int]] = {c.number: set() for c in study.configs}
    spent = 0
    decided = False

    def arms() -> list[Arm]:
        return [Arm(n, tuple(values[n]), frozenset(repeats[n])) for n in by_number]

    while policy is not None:
        decision = policy.decide(arms(), spent=spent)
        if decision.measure is None:
            decided = "budget" not in decision.reason and "limit" not in decision.reason
            break
        number, repeat = decision.measure
        c = by_number[number]
        values[number].append(c.true * math.exp(rng.normal(0.0, c.sigma)))
        repeats[number].add(repeat)
        spent += 1
    best = winner(arms())
    assert best is not None
    return Pick(winner=best.number, restarts=spent, decided=decided)


def judge(
    studies: Sequence[Finished], rules: Sequence[Rule], *, replays: int
) -> list[dict[str, Any]]:
    rows = []
    for rule in rules:
        hits, shortfalls, restarts, decided = [], [], [], []
        per_study = []
        for study in studies:
            top = study.best_true
            true = {c.number: c.true for c in study.configs}
            rng = np.random.default_rng([study.seed, 4242])
            other = np.random.default_rng([study.seed, 4343])
            drawn = rule.policy is not None or rule.matched is not None
            # No re-measurement draws nothing: one replay says it all.
            for _ in range(replays if drawn else 1):
                policy = rule.policy
                if rule.matched is not None:
                    took = replay_study(study, rule.matched, other).restarts
                    policy = RacePolicy(budget=took)
                pick = replay_study(study, policy, rng)
                shortfall = 1.0 - true[pick.winner] / top
                weight = 1 if drawn else replays
                hits += [shortfall <= WITHIN + 1e-12] * weight
                shortfalls += [shortfall] * weight
                restarts += [pick.restarts] * weight
                decided += [pick.decided] * weight
            per_study.append(float(np.mean(hits[-replays:])))
        rows.append(
            {
                "rule": rule.name,
                "within_2pct": float(np.mean(hits)),
                "within_2pct_se": float(np.std(per_study, ddof=1) / math.sqrt(len(per_study)))
                if len(per_study) > 1
                else 0.0,
                "mean_shortfall": float(np.mean(shortfalls)),
                "restarts_mean": float(np.mean(restarts)),
                "restarts_max": int(np.max(restarts)),
                "decided": float(np.mean(decided)),
            }
        )
    return rows


def budget_rules(budgets: Sequence[int]) -> tuple[Rule, ...]:
    """The race at each budget, beside no re-measurement and fixed top-3 x2."""
    return (RULES[0], RULES[1], *(Rule(f"race, budget {b}", RacePolicy(budget=b)) for b in budgets))


def sigma_of(surface: Surface, level: str) -> Callable[[TrialConfig], float]:
    """A fixed sigma (``"0.05"``) or the surface's own ``noise_sigma`` (``"surface"``)."""
    if level == "surface":
        if surface.noise_sigma is None:
            raise SystemExit(f"surface {surface.name} has no noise_sigma(config)")
        return surface.noise_sigma
    value = float(level)
    return lambda _config: value


def _describe(studies: Sequence[Finished]) -> str:
    sizes = [len(s.configs) for s in studies]
    near = [sum(c.true >= (1 - WITHIN) * s.best_true for c in s.configs) for s in studies]
    return (
        f"{len(studies)} studies, median {np.median(sizes):.0f} configurations measured, "
        f"{np.median(near):.0f} within 2% of the best (medians)"
    )


def markdown(report: Mapping[str, Any]) -> str:
    lines = [
        "| surface | noise | policy | within 2% (+- SE over studies) | mean shortfall | "
        "restarts (mean, max) | stopped by itself |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for cell in report["cells"]:
        for row in cell["rows"]:
            lines.append(
                f"| {cell['surface']} | {cell['noise']} | {row['rule']} | "
                f"{100 * row['within_2pct']:.1f}% +- {100 * row['within_2pct_se']:.1f} | "
                f"{100 * row['mean_shortfall']:.2f}% | "
                f"{row['restarts_mean']:.2f}, {row['restarts_max']} | "
                f"{100 * row['decided']:.0f}% |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--surfaces", default=",".join(ALL_SURFACES))
    parser.add_argument(
        "--noise",
        nargs="*",
        default=["0.03", "0.05", "0.08"],
        help="lognormal sigma of one measurement, or 'surface' (its noise_sigma)",
    )
    parser.add_argument("--seeds", type=int, default=12, help="studies per surface and noise")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--replays", type=int, default=50, help="re-measure phases per study")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--budgets",
        default=None,
        help="comma-separated restart budgets: the race at each, instead of the default rules",
    )
    parser.add_argument(
        "--studies-from",
        type=Path,
        default=None,
        help="replay the finished studies of an earlier --json instead of running the loops",
    )
    args = parser.parse_args(argv)
    earlier: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
    if args.studies_from is not None:
        for cell in json.loads(args.studies_from.read_text())["cells"]:
            earlier[(cell["surface"], cell["noise"])] = cell["configs"]
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rules: tuple[Rule, ...] = RULES
    if args.budgets:
        rules = budget_rules([int(b) for b in args.budgets.split(",") if b.strip()])
    started = time.perf_counter()
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "cells": []}
    for name in [s for s in args.surfaces.split(",") if s]:
        surface = load_surface(name)
        for level in args.noise:
            t0 = time.perf_counter()
            if (name, level) in earlier:
                studies = [
                    Finished(name, level, args.first_seed + i, tuple(Measured(**c) for c in cs))
                    for i, cs in enumerate(earlier[(name, level)])
                ]
            else:
                sigma = sigma_of(surface, level)
                studies = [
                    finish_study(surface, sigma, seed=seed, trials=args.trials, noise=level)
                    for seed in range(args.first_seed, args.first_seed + args.seeds)
                ]
            t1 = time.perf_counter()
            rows = judge(studies, rules, replays=args.replays)
            cell = {
                "surface": name,
                "noise": level,
                "studies": _describe(studies),
                "loop_s": t1 - t0,
                "replay_s": time.perf_counter() - t1,
                "rows": rows,
                "configs": [[asdict(c) for c in s.configs] for s in studies],
            }
            report["cells"].append(cell)
            print(
                f"{name} noise {level}: {cell['studies']}; loops {cell['loop_s']:.0f} s, "
                f"replays {cell['replay_s']:.0f} s",
                flush=True,
            )
    report["wall_s"] = time.perf_counter() - started
    print()
    print(markdown(report))
    print(f"\nwall: {report['wall_s']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
