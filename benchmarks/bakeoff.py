"""The sampler bake-off: every sampler on a family of generated surfaces, by difficulty level.

The default sampler was first chosen on three surfaces written here; a default is judged on
cases nobody tuned it to. This runs the loop's own suggest/finish code
(:func:`sample_efficiency.run_one`: real ``SearchSpace.suggest``, forbidden proposals never
launched, duplicates reused, crashes completed as the runner completes them) for each
sampler and seed on

* the generated family (``benchmarks/surfaces/generated.py``, ``family(N)``: easy, medium and
  hard levels, each surface with its own heteroscedastic measurement noise);
* the ``heldout`` preset (shaped like a surface a user reported: six levers, a needle of two
  categoricals, a crash region, a wrong-output trap, 3% noise), several seeds;
* the three hand-written surfaces (``dsv4-sim``, ``gemm-kernel``, ``vllm-serving``), noiseless.

Reported per level and sampler, pooled over surfaces and seeds: trials to 90/95% of the
optimum (median; a run that never got there counts as budget + 1), the best found at
20/40/100 trials (true value of the configuration the tuner would report, % of the
optimum: median [IQR]), crash launches, and the random-equivalent budget of the best at 40
trials: the smallest N at which random search's median best reaches it ("default at 40 =
random at N"; random runs ``--random-trials``).

Usage (the full run; the GP sampler is slow and runs fewer trials, ``--cap gp=40``)::

    .venv/bin/python benchmarks/bakeoff.py --json reports/bakeoff.json
    .venv/bin/python benchmarks/bakeoff.py --samplers tpe,random --family 6 --seeds 3

``--log FILE.jsonl`` appends each run as it finishes and skips the runs already in it, so a
long run (gp at 10 seeds: hours here) survives being stopped and resumes where it was.
A gp worker runs torch on one thread: two workers with torch's default of one thread per
core would ask for four on two cores.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sample_efficiency as se  # noqa: E402

DEFAULT_SAMPLERS = (
    "tpe",
    "tpe-plain",
    "tpe-indep",
    "random",
    "qmc",
    "nsga2",
    "gp",
    "catcma",
    "rfbo",
)
BUNDLED = ("dsv4-sim", "gemm-kernel", "vllm-serving")
MARKS = (20, 40, 100)
LEVELS = (0.90, 0.95)


def surfaces(family: int, heldout: int, bundled: Sequence[str]) -> dict[str, str]:
    """Surface name -> level ("bundled" for the hand-written ones)."""
    out = {name: name.split("-")[1] for name in se.expand_surfaces([f"family:{family}"])}
    out.update({f"gen-heldout-{seed}": "heldout" for seed in range(heldout)})
    out.update(dict.fromkeys(bundled, "bundled"))
    return out


def _task(args: tuple[str, str, int, int]) -> dict[str, Any]:
    name, sampler, seed, trials = args
    if sampler == "gp":
        import torch

        torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    surface = se.load_surface(name)
    started = time.perf_counter()
    run = se.run_one(surface, sampler, seed, trials, surface_noise=True)
    launches = [i for i, k in enumerate(run.kinds) if k == "launch"]
    return {
        "surface": name,
        "sampler": sampler,
        "seed": seed,
        "curve": [v / surface.optimum for v in run.incumbent],
        "crashes": sum(1 for i in launches if run.failures[i] is not None),
        "launches": len(launches),
        "forbidden_launched": run.forbidden_launched,
        "seconds": time.perf_counter() - started,
        "trials": trials,
    }


def _key(name: str, sampler: str, seed: int, trials: int) -> tuple[str, str, int, int]:
    return (name, sampler, seed, trials)


def load_log(path: Path | None) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Runs already finished (``--log``), by (surface, sampler, seed, trials)."""
    if path is None or not path.exists():
        return {}
    done = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            res = json.loads(line)
        except json.JSONDecodeError:  # a line cut short when the run was stopped
            continue
        trials = int(res.get("trials", len(res["curve"])))
        done[_key(res["surface"], res["sampler"], res["seed"], trials)] = res
    return done


def run(
    names: Mapping[str, str],
    samplers: Sequence[str],
    seeds: Sequence[int],
    *,
    trials: int,
    random_trials: int,
    caps: Mapping[str, int],
    workers: int,
    log: Path | None = None,
) -> list[dict[str, Any]]:
    done = load_log(log)
    tasks = []
    for name in names:
        for sampler in samplers:
            budget = random_trials if sampler == "random" else caps.get(sampler, trials)
            tasks += [(name, sampler, seed, budget) for seed in seeds]
    slow = {"gp": 0, "rfbo": 1, "catcma": 2, "tpe": 3, "tpe-plain": 3, "nsga2": 4}
    tasks.sort(key=lambda t: slow.get(t[1], 9))  # slow ones first: the pool ends together
    results = [done[_key(*t)] for t in tasks if _key(*t) in done]
    todo = [t for t in tasks if _key(*t) not in done]
    if results:
        print(f"{len(results)} runs from {log}, {len(todo)} to go", file=sys.stderr)
    sink = log.open("a") if log is not None else None
    try:
        if workers > 1:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                for res in pool.imap_unordered(_task, todo, chunksize=1):
                    results.append(_logged(res, sink))
        else:
            results += [_logged(_task(t), sink) for t in todo]
    finally:
        if sink is not None:
            sink.close()
    return results


def _logged(res: dict[str, Any], sink: Any) -> dict[str, Any]:
    if sink is not None:
        sink.write(json.dumps(res) + "\n")
        sink.flush()
    return res


def _reach(curve: Sequence[float], level: float) -> int | None:
    for i, value in enumerate(curve):
        if value >= level * (1 - 1e-9):
            return i + 1
    return None


def random_equivalent(random_curves: Sequence[Sequence[float]], target: float) -> int | None:
    """Smallest N at which random search's median best reaches ``target`` (None: not within
    its budget)."""
    arr = np.asarray(random_curves, dtype=float)
    medians = np.median(arr, axis=0)
    hits = np.nonzero(medians >= target - 1e-12)[0]
    return int(hits[0]) + 1 if hits.size else None


def summarize(results: Sequence[Mapping[str, Any]], names: Mapping[str, str]) -> dict[str, Any]:
    """Per level ("all" pools the generated levels), per sampler."""
    groups: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for res in results:
        level = names[res["surface"]]
        keys = [level] + (["all"] if level in ("easy", "medium", "hard") else [])
        for key in keys:
            groups.setdefault(key, {}).setdefault(res["sampler"], []).append(res)
    out: dict[str, Any] = {}
    for level, by_sampler in groups.items():
        random_curves = [r["curve"] for r in by_sampler.get("random", [])]
        rows: dict[str, Any] = {}
        for sampler, runs in by_sampler.items():
            budget = min(len(r["curve"]) for r in runs)
            row: dict[str, Any] = {"runs": len(runs), "trials": budget}
            for lv in LEVELS:
                reached = [_reach(r["curve"], lv) for r in runs]
                row[f"to_{round(lv * 100)}"] = {
                    "median": float(np.median([budget + 1 if n is None else n for n in reached])),
                    "not_reached": sum(n is None for n in reached),
                }
            row["best_at"] = {
                str(n): se._spread([100.0 * r["curve"][n - 1] for r in runs])
                for n in MARKS
                if n <= budget
            }
            row["crashes"] = float(np.mean([r["crashes"] for r in runs]))
            row["crash_share"] = sum(r["crashes"] for r in runs) / max(
                1, sum(r["launches"] for r in runs)
            )
            row["forbidden_launched"] = sum(r["forbidden_launched"] for r in runs)
            row["seconds_per_run"] = float(np.mean([r["seconds"] for r in runs]))
            if random_curves and "40" in row["best_at"]:
                target = row["best_at"]["40"]["median"] / 100.0
                row["random_equivalent_40"] = random_equivalent(random_curves, target)
            rows[sampler] = row
        out[level] = rows
    return out


def _cell(q: Mapping[str, float]) -> str:
    return f"{q['median']:.1f} [{q['q1']:.0f}-{q['q3']:.0f}]"


def markdown(summary: Mapping[str, Any], *, random_trials: int) -> str:
    lines: list[str] = []
    order = ["all", "easy", "medium", "hard", "heldout", "bundled"]
    for level in [lv for lv in order if lv in summary]:
        rows = summary[level]
        lines += [f"#### {level}", ""]
        lines.append(
            "| sampler | runs | to 90% | to 95% | best @20 | best @40 | best @100 | "
            "crash launches | = random at N (best @40) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for sampler, row in sorted(
            rows.items(), key=lambda kv: -kv[1]["best_at"].get("40", {"median": 0})["median"]
        ):
            budget = row["trials"]

            def reach(key: str, row: Mapping[str, Any] = row, budget: int = budget) -> str:
                m = row[key]["median"]
                text = f">{budget}" if m > budget else f"{m:.0f}"
                return text + (
                    f" ({row[key]['not_reached']} n/r)" if row[key]["not_reached"] else ""
                )

            best = [
                _cell(row["best_at"][str(n)]) if str(n) in row["best_at"] else "-" for n in MARKS
            ]
            eq = row.get("random_equivalent_40")
            eq_text = (
                "-" if sampler == "random" else (f">{random_trials}" if eq is None else str(eq))
            )
            lines.append(
                f"| {sampler} | {row['runs']} | {reach('to_90')} | {reach('to_95')} | "
                + " | ".join(best)
                + f" | {row['crashes']:.1f} ({100 * row['crash_share']:.0f}%) | {eq_text} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", default=",".join(DEFAULT_SAMPLERS))
    parser.add_argument("--family", type=int, default=30, help="generated surfaces (N/3 a level)")
    parser.add_argument("--heldout", type=int, default=5, help="seeds of the heldout preset")
    parser.add_argument("--bundled", default=",".join(BUNDLED))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--random-trials", type=int, default=400)
    parser.add_argument("--cap", action="append", default=[], help="SAMPLER=TRIALS")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--log", type=Path, default=None, help="append runs; resume from it")
    args = parser.parse_args(argv)
    samplers = [s for s in args.samplers.split(",") if s]
    caps = {k: int(v) for k, v in (c.split("=", 1) for c in args.cap)}
    names = surfaces(args.family, args.heldout, [b for b in args.bundled.split(",") if b])
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.perf_counter()
    for name in names:  # optima once, in the parent (forked workers inherit the caches)
        se.load_surface(name)
    results = run(
        names,
        samplers,
        seeds,
        trials=args.trials,
        random_trials=args.random_trials,
        caps=caps,
        workers=args.workers,
        log=args.log,
    )
    summary = summarize(results, names)
    text = markdown(summary, random_trials=args.random_trials)
    wall = time.perf_counter() - started
    print(text)
    print(f"wall: {wall:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join(["benchmarks/bakeoff.py", *(argv or sys.argv[1:])]),
            "wall_seconds": wall,
            "surfaces": names,
            "summary": summary,
            "runs": results,
        }
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
