"""Time the README's main job: `autotune run --trials N` on the bundled simulated deployment.

Runs in a scratch directory (its own SQLite file), then prints the wall time, the time per
trial, the best and baseline throughputs and their ratio, and the phase breakdown. Usage:

    .venv/bin/python benchmarks/default_study.py --trials 200
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as tmp:
        db = Path(tmp) / "bench.db"
        cmd = [
            sys.executable,
            "-m",
            "autotune",
            "run",
            "--trials",
            str(args.trials),
            "--quiet",
            "--study",
            "dsv4-flash-sim",
            "--storage",
            f"sqlite:///{db}",
            "--study-file",
            str(REPO / "studies" / "dsv4-flash-sim.yaml"),
        ]
        if args.seed is not None:
            cmd += ["--seed", str(args.seed)]
        started = time.monotonic()
        subprocess.run(cmd, cwd=tmp, check=True)
        wall = time.monotonic() - started
        study = optuna.load_study(study_name="dsv4-flash-sim", storage=f"sqlite:///{db}")
        trials = study.trials
        feasible = [t for t in trials if t.values and not t.user_attrs.get("failure")]
        baseline = next(t for t in trials if t.user_attrs.get("is_baseline"))
        best = max(feasible, key=lambda t: t.values[0])
        phases: dict[str, float] = collections.defaultdict(float)
        for t in trials:
            for k, v in t.user_attrs.get("phase_seconds", {}).items():
                phases[k] += v
        failures = collections.Counter(t.user_attrs.get("failure") or "ok" for t in trials)
    per_trial = wall / len(trials)
    print(f"trials: {len(trials)} wall: {wall:.0f} s ({wall / 60:.1f} min, {per_trial:.2f} s each)")
    print(f"baseline #{baseline.number}: {baseline.values[0]:.1f} tok/s")
    gain = best.values[0] / baseline.values[0]
    print(f"best #{best.number}: {best.values[0]:.1f} tok/s  ({gain:.1f}x)")
    print("phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(phases.items())))
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in failures.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
