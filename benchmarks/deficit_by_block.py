"""Where the default sampler's shortfall lives on the generated family (issue 16, part 3).

A generated surface (``benchmarks/surfaces/generated.py``) is the product of three independent
blocks (numeric: memory, batch, speculation; categorical: the needles; main effects), so the
log of a configuration's shortfall against the optimum splits exactly into one deficit per
block (``GeneratedSurface.block_deficits``). This runs the pure-surface loop
(``sample_efficiency.run_one``: the product's suggest/finish code, each launch measured with
the surface's own noise) for every surface of the chosen levels and seeds, takes the
configuration the tuner would report after ``--trials`` trials (its best measured launch) and
the truly best one it measured, and prints the mean deficit per block, the share of runs with
a categorical deficit over 2% and the median fraction of the optimum.

    .venv/bin/python benchmarks/deficit_by_block.py --levels easy,medium,hard --surfaces 10 \\
        --seeds 5 --trials 40                                            # ~30 s
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_efficiency import generated_module, run_one, surface_of  # noqa: E402

BLOCKS = ("numeric", "categorical", "main")
CATEGORICAL_DEFICIT = 0.02
"""A log deficit above this (about 2% of throughput) counts as a missed combination."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="easy,medium,hard")
    parser.add_argument("--surfaces", type=int, default=10, help="surfaces per level")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--sampler", default="tpe")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(
        f"| level | runs | reported, of optimum (median) | log deficit: {' / '.join(BLOCKS)} "
        "(mean) | categorical deficit > 2% | best measured, of optimum (median) | its deficits |"
    )
    print("|---|---:|---:|---|---:|---:|---|")
    for level in [x for x in args.levels.split(",") if x]:
        reported: list[list[float]] = []
        truest: list[list[float]] = []
        for i in range(args.surfaces):
            gen = generated_module().by_name(f"gen-{level}-{i}")
            surface = surface_of(gen)
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                run = run_one(surface, args.sampler, seed, args.trials, surface_noise=True)
                measured = [
                    k
                    for k in range(args.trials)
                    if run.kinds[k] == "launch" and run.failures[k] is None and run.observed[k] > 0
                ]
                pick = max(measured, key=lambda k: run.observed[k])
                top = max(measured, key=lambda k: run.true_values[k])
                for rows, k in ((reported, pick), (truest, top)):
                    deficits = gen.block_deficits(run.configs[k])
                    rows.append([run.true_values[k] / gen.optimum, *deficits])
        a, b = np.array(reported), np.array(truest)
        print(
            f"| {level} | {len(a)} | {np.median(a[:, 0]):.3f} | "
            + " / ".join(f"{a[:, j].mean():.3f}" for j in (1, 2, 3))
            + f" | {np.mean(a[:, 2] > CATEGORICAL_DEFICIT):.0%} | {np.median(b[:, 0]):.3f} | "
            + " / ".join(f"{b[:, j].mean():.3f}" for j in (1, 2, 3))
            + " |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
