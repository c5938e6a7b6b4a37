"""How close the twin's servers come to their own model, by clock and by measurement length.

The performance model (``autotune.sim.perf_model.expectation``) is a closed loop's steady
state. A trial measures something else: ``requests`` requests at concurrency C after a
warm-up, from a synchronized start (every stream sends at once, the prefill queue fills,
the last requests drain alone), on servers whose simulated clock runs ``sim_speedup`` x
faster than the modeled hardware on a shared 2-core machine. This script measures the
model's optimum and two configurations near it (``winner_noise.calibration_configs``) on the
simulated deployment, through the tuner's own code path (``TrialStep.evaluate``: restart, probe,
warm-up, measure), at each clock and each number of requests, and prints measured / model:
which part of a shortfall is the clock and which the measurement's length.

    .venv/bin/python benchmarks/twin_fidelity.py --speedups 8,3,1 --requests 32,256
    .venv/bin/python benchmarks/twin_fidelity.py --speedups 3,2 --requests 128,256 --baseline

One JSON line per measurement on stdout, then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from explain_truth import with_speedup  # noqa: E402
from winner_noise import (  # noqa: E402
    calibration_configs,
    evaluate,
    scratch_tuner,
    true_throughput,
)

from autotune.space import load_space  # noqa: E402
from autotune.study.definition import load_study_definition  # noqa: E402


def measure(
    speedup: float, requests: list[int], *, repeats: int, baseline: bool
) -> list[dict[str, Any]]:
    """Every configuration at every length, ``repeats`` times, from fresh services each time
    (the longer loads after the first reuse that start's processes)."""
    tmp = Path(tempfile.mkdtemp(prefix="twin-fidelity-"))
    definition = load_study_definition(with_speedup(speedup, tmp))
    space = load_space(definition.resolve(definition.space))
    configs = calibration_configs(space, definition.load)
    if baseline:  # the slowest configuration: 60 s a run at any clock (max_duration_s)
        configs["baseline"] = space.baseline_params()
    rows: list[dict[str, Any]] = []
    with scratch_tuner(definition, tmp) as tuner:
        for rep in range(repeats):
            for name, config in configs.items():
                model = true_throughput(space, config, definition.load)
                for i, n in enumerate(requests):
                    load = definition.load.model_copy(update={"requests": n, "target_rel_ci": None})
                    outcome = evaluate(tuner, config, load, fresh=i == 0)
                    measured = (outcome.attrs.get("metrics") or {}).get("output_throughput")
                    row = {
                        "speedup": speedup,
                        "config": name,
                        "requests": n,
                        "repeat": rep,
                        "model": model,
                        "measured": measured,
                        "ratio": measured / model if measured and model else None,
                        "measure_s": outcome.attrs.get("phase_seconds", {}).get("measure"),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    configs = list(dict.fromkeys(r["config"] for r in rows))
    out = [
        "| clock | requests | " + " | ".join(f"{c}: measured / model" for c in configs) + " |",
        "|---|---:|" + "---:|" * len(configs),
    ]
    cells = {(r["speedup"], r["requests"]) for r in rows}
    for speedup, n in sorted(cells, key=lambda k: (-k[0], k[1])):
        line = f"| {speedup:g}x | {n} |"
        for c in configs:
            ratios = [
                r["ratio"]
                for r in rows
                if (r["speedup"], r["requests"], r["config"]) == (speedup, n, c) and r["ratio"]
            ]
            line += f" {statistics.fmean(ratios):.3f} |" if ratios else " - |"
        out.append(line)
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speedups", default="8,3,1")
    parser.add_argument("--requests", default="32,256")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline", action="store_true", help="also the bundled baseline")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    rows: list[dict[str, Any]] = []
    for speedup in (float(s) for s in args.speedups.split(",")):
        rows += measure(
            speedup,
            [int(n) for n in args.requests.split(",")],
            repeats=args.repeats,
            baseline=args.baseline,
        )
    print(table(rows))


if __name__ == "__main__":
    main()
