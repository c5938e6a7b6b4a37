"""Trials per hour with 1 and with K workers sharing one study on PostgreSQL.

Starts a throw-away PostgreSQL server (``tests/pg_server.py``: Debian's postgresql-15, run as
an unprivileged user, loopback only), then runs the same small study (the bundled space and
simulated deployment, the load of ``tests/data/e2e-study.yaml``, ``--trials N``) with one
worker, then with K workers (``autotune run --worker wI`` each, each its own simulated
deployment), each on a fresh database, alternating ``--rounds`` times (1, K, 1, K, ...) so
machine load falls on both alike. Reports wall time, trials per hour, the speed-up, and what
coordination cost: configurations measured twice (must be 0), trials not run because another
worker held their configuration, results reused across workers. Usage::

    .venv/bin/python benchmarks/workers_scaling.py --trials 30 --workers 3 --rounds 2

All workers run on this machine: with 2 cores, K workers share the CPU that one worker's
tuner, load generator and simulated servers use, so the speed-up is bounded by CPU, not by
the coordination; on real deployments each worker has its own GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from pg_server import PostgresServer  # noqa: E402


def study_file(tmp: Path, speedup: float | None) -> Path:
    data = yaml.safe_load((REPO / "tests" / "data" / "e2e-study.yaml").read_text())
    data["space"] = str(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    deployment = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
    if speedup is not None:  # slower servers: trials wait on the (simulated) GPUs, not CPU
        spec = yaml.safe_load(deployment.read_text())
        spec["sim_speedup"] = speedup
        deployment = tmp / "deployment.yaml"
        deployment.write_text(yaml.safe_dump(spec))
    data["deployment"] = str(deployment)
    data["remeasure"] = {"top_k": 0, "repeats": 0}  # trials only: the figure is trials/hour
    path = tmp / "scaling.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_study(
    pg: PostgresServer, tmp: Path, *, workers: int, trials: int, seed: int, speedup: float | None
) -> dict:
    url = pg.url(pg.create_database())
    path = study_file(tmp, speedup)
    logs = []
    t0 = time.monotonic()
    procs = []
    for i in range(workers):
        log = tmp / f"k{workers}-{i}-{time.time_ns()}.log"
        logs.append(log)
        cmd = [sys.executable, "-m", "autotune", "run", "--study", "scaling", "--storage", url]
        cmd += ["--study-file", str(path), "--trials", str(trials), "--worker", f"w{i}"]
        cmd += ["--seed", str(seed + i), "--quiet"]
        procs.append(
            subprocess.Popen(
                cmd, cwd=tmp, stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ
            )
        )
    for p in procs:
        p.wait()
    wall = time.monotonic() - t0
    if any(p.returncode for p in procs):
        raise SystemExit("a worker failed:\n" + "\n".join(x.read_text()[-2000:] for x in logs))
    study = optuna.load_study(study_name="scaling", storage=url)
    all_trials = study.get_trials(deepcopy=False)
    complete = [t for t in all_trials if t.state == TrialState.COMPLETE]
    measured = Counter(
        json.dumps(t.user_attrs["config"], sort_keys=True)
        for t in complete
        if t.user_attrs.get("reused_from") is None and t.user_attrs.get("failure") != "forbidden"
    )
    launched = [t for t in complete if (t.user_attrs.get("phase_seconds") or {}).get("restart")]
    return {
        "workers": workers,
        "wall_s": wall,
        "complete": len(complete),
        "trials_per_hour": 3600 * len(complete) / wall,
        "launched": len(launched),
        "measured_twice": sum(n - 1 for n in measured.values() if n > 1),
        "claimed_fail": sum(1 for t in all_trials if t.user_attrs.get("failure") == "claimed"),
        "reused": sum(1 for t in complete if t.user_attrs.get("reused_from") is not None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--speedup",
        type=float,
        default=None,
        help="sim_speedup of the servers (default: the bundled deployment's 8)",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    with PostgresServer() as pg, tempfile.TemporaryDirectory(prefix="autotune-scale-") as d:
        tmp = Path(d)
        for r in range(args.rounds):
            for k in (1, args.workers):
                row = run_study(
                    pg,
                    tmp,
                    workers=k,
                    trials=args.trials,
                    seed=args.seed + 100 * r,
                    speedup=args.speedup,
                )
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.trials} trials per study, {os.cpu_count()} CPUs, sim_speedup {args.speedup}")
    print(
        "| workers | round | wall s | trials/hour | launched | measured twice | claimed | reused |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['workers']} | {row['round']} | {row['wall_s']:.0f} | "
            f"{row['trials_per_hour']:,.0f} | {row['launched']} | {row['measured_twice']} | "
            f"{row['claimed_fail']} | {row['reused']} |"
        )
    one = [r["trials_per_hour"] for r in rows if r["workers"] == 1]
    many = [r["trials_per_hour"] for r in rows if r["workers"] == args.workers]
    ratios = [m / o for o, m in zip(one, many, strict=True)]
    print(
        f"\n{args.workers} workers vs 1: {statistics.fmean(many):,.0f} vs "
        f"{statistics.fmean(one):,.0f} trials/hour, speed-up per round "
        + ", ".join(f"{x:.2f}x" for x in ratios)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
