"""Sample efficiency and crash-awareness of the samplers, measured without servers.

Each run replays the tuning loop of ``autotune/study/runner.py`` on a pure function instead
of a deployment: real ``SearchSpace.suggest`` on real Optuna trials from the real
``make_sampler``; the baseline enqueued first; a forbidden proposal recorded infeasible and
never launched; an identical configuration reused, not launched; a launch that crashes or
serves wrong text completed with the runner's own failed values and constraints
(``autotune.trial.failed`` / ``reused_outcome`` of ``autotune.study.record``); every trial stored
by ``finish_trial``. The sampler therefore sees exactly what it sees in production, and
the true optimum of each surface is known, so "how many trials to get within 5% of it"
has an exact answer.

Surfaces:

* ``dsv4-sim``: the bundled study (``studies/dsv4-flash-sim.yaml``: C=16, 256 in / 128 out).
  Each configuration is rendered into the prefill and decode command lines and environments
  (``autotune.render``, the launcher's input) and parsed by the simulated servers' own
  parser (``autotune.sim.args.parse_config``); start-up failures (OOM, rejected arguments)
  and wrong text come from ``perf_model`` on those parsed configurations, throughput from
  ``perf_model.expectation`` (the servers' steady state; no noise unless ``--noise``).
  Optimum: ``autotune.sim.optimum.search`` (exact).
* ``gemm-kernel`` and ``vllm-serving``: ``benchmarks/surfaces/*.py`` + ``*.yaml``, synthetic
  surfaces with interacting and conditional parameters and crash regions, optimum by
  exhaustive enumeration.
* ``gen-<level>-<seed>`` (level ``easy``, ``medium``, ``hard`` or the ``heldout`` preset,
  optionally ``-up<k>`` engine upgrades): seeded generated surfaces,
  ``benchmarks/surfaces/generated.py``, with their exact optimum, needle fraction (share of
  random configurations within 5% of the optimum) and own heteroscedastic noise model
  (``--surface-noise``). ``--surfaces family:30`` is ``generated.family(30)``: ten of each
  level (``family:N:FIRST`` starts the seeds at FIRST).
* ``gen-<level>-<seed>-rules<P>`` (``family:N:FIRST:rulesP``): the same surface with seeded
  forbidden rules added until P% of random draws break one, as the spaces written from a
  real engine's refusals do (``benchmarks/_sample_efficiency/rules.py``).

Reported per surface and sampler, over the seeds: trials (and launches) to reach 90/95/99%
of the optimum (median [IQR] min-max; a seed that never got there counts as budget + 1,
"n/r"), the best found at 25/50/100/200 trials and after 8/16/32 launches (a GPU study's
budget is restarts: forbidden and reused trials are free there), launches, launches that
crashed, forbidden proposals (and how many were launched: must be 0), duplicates, sampler
time per trial, and
two crash-awareness figures: "known-cause crash proposals", the share of proposals (after the
first crash) that crash the way an earlier launch already did (land in a crash region
already hit), and "near-crash repeats", launched crashes within one lever (``distance``) of
an earlier crash of the same cause. Random search's odds per trial are estimated by Monte
Carlo (``random_odds``) to give its expected trials to each level beyond the budget.

Usage (the defaults are the full run: every sampler, 20 seeds from 1000, 200 trials, all
three surfaces, two processes)::

    .venv/bin/python benchmarks/sample_efficiency.py --json reports/sample_efficiency.json
    .venv/bin/python benchmarks/sample_efficiency.py --samplers tpe,random --seeds 3 \
        --trials 100 --surfaces dsv4-sim
    .venv/bin/python benchmarks/sample_efficiency.py --samplers tpe,random --seeds 5 \
        --trials 100 --surfaces family:30 --surface-noise

Besides ``make_sampler``'s names: ``tpe-plain``, ``tpe-indep`` and ``tpe-mv`` (plain Optuna
TPE variants, ``build_sampler``), ``tpe-launch-startup`` (the default with its start-up
counted in launches); ``gp``, ``catcma`` and ``rfbo`` need their extras and are
not in the default list.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# The code lives in benchmarks/_sample_efficiency/; run by path, this file finds it from the
# repository root.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from autotune.study.definition import OBJECTIVES  # noqa: E402
from benchmarks._sample_efficiency.markdown import markdown, verdicts  # noqa: E402
from benchmarks._sample_efficiency.runs import (  # noqa: E402
    EXTRA_SAMPLERS,
    INDEPENDENT_TPE,
    MULTIVARIATE_TPE,
    NEAR,
    NUMERIC_CELLS,
    PLAIN_TPE,
    Run,
    SamplerFactory,
    build_sampler,
    distance,
    run_one,
)
from benchmarks._sample_efficiency.summary import (  # noqa: E402
    CHECKPOINTS,
    LEVELS,
    _spread,
    best_at,
    build_report,
    launches_to,
    random_odds,
    run_all,
    summarize,
    trials_to,
)
from benchmarks._sample_efficiency.surfaces import (  # noqa: E402
    REPO,
    STUDY_FILE,
    SURFACES_DIR,
    Launch,
    SimEvaluator,
    Surface,
    _load_module,
    expand_surfaces,
    generated_module,
    load_surface,
    surface_of,
)

__all__ = [
    "ALL_SAMPLERS",
    "ALL_SURFACES",
    "CHECKPOINTS",
    "EXTRA_SAMPLERS",
    "INDEPENDENT_TPE",
    "LEVELS",
    "MULTIVARIATE_TPE",
    "NEAR",
    "NUMERIC_CELLS",
    "PLAIN_TPE",
    "REPO",
    "STUDY_FILE",
    "SURFACES_DIR",
    "Launch",
    "Run",
    "SamplerFactory",
    "SimEvaluator",
    "Surface",
    "_load_module",
    "_spread",
    "best_at",
    "build_report",
    "build_sampler",
    "distance",
    "expand_surfaces",
    "generated_module",
    "launches_to",
    "load_surface",
    "main",
    "markdown",
    "random_odds",
    "run_all",
    "run_one",
    "summarize",
    "surface_of",
    "trials_to",
    "verdicts",
]

ALL_SURFACES = ("dsv4-sim", "gemm-kernel", "vllm-serving")
ALL_SAMPLERS = ("tpe", "tpe-plain", "random", "grid", "qmc", "nsga2")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", default=",".join(ALL_SAMPLERS))
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds")
    parser.add_argument("--first-seed", type=int, default=1000, help="seeds start here")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--surfaces", default=",".join(ALL_SURFACES))
    parser.add_argument("--noise", type=float, default=0.0, help="lognormal sigma on the score")
    parser.add_argument(
        "--surface-noise",
        action="store_true",
        help="generated surfaces use their own per-configuration sigma instead of --noise",
    )
    parser.add_argument("--objective", default="throughput", choices=OBJECTIVES)
    parser.add_argument("--odds-draws", type=int, default=20000, help="random search odds")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    samplers = [s for s in args.samplers.split(",") if s]
    surfaces = expand_surfaces([s for s in args.surfaces.split(",") if s])
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.perf_counter()
    runs = run_all(
        surfaces,
        samplers,
        seeds,
        args.trials,
        noise=args.noise,
        surface_noise=args.surface_noise,
        objective=args.objective,
        workers=args.workers,
    )
    report = build_report(
        runs,
        trials=args.trials,
        seeds=seeds,
        noise=args.noise,
        objective=args.objective,
        odds_draws=args.odds_draws,
        surface_noise=args.surface_noise,
    )
    report["wall_seconds"] = time.perf_counter() - started
    report["command"] = " ".join(["benchmarks/sample_efficiency.py", *(argv or sys.argv[1:])])
    report["verdicts"] = verdicts(report)
    print(markdown(report))
    print("\n".join(report["verdicts"]))
    print(f"wall: {report['wall_seconds']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
