"""Issue 7's figures, read back from the studies the H200 run stored (benchmarks/h200/*.db).

    .venv/bin/python benchmarks/h200_summary.py

The studies were produced on one NVIDIA H200 by scripts/h200/run.sh (see BENCHMARKS.md,
"transformers serve on an H200"); this script only reads them, so every figure in that
section can be checked without a GPU.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import optuna

from autotune.loadgen import LiveEstimate, LoadSpec
from autotune.loadgen.client import ESTIMATE_INTERVAL_S
from autotune.results import best_estimate, config_estimates
from autotune.study.abort import early_abort_reason
from autotune.study.definition import load_study_definition

HERE = Path(__file__).resolve().parent / "h200"
HAND_PICKED_TOKS = 501.8
"""--continuous-batching --cb-use-cuda-graph --cb-max-batch-tokens 512, measured by hand."""


def _load(name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{HERE / name}.db")


def _flags(params: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


def tuning(study: optuna.Study) -> None:
    print(f"## {study.study_name}: every trial\n")
    print("| trial | tok/s | how | restart s | warm-up s | measure s | total s | config |")
    print("|---|---|---|---|---|---|---|---|")
    restarts, first_within = [], None
    for t in study.trials:
        a = t.user_attrs
        ps = a.get("phase_seconds", {})
        value = t.values[0] if t.values else None
        if a.get("failure") == "interrupted":
            how = "interrupted (first start failed: carried typing-extensions too old)"
        elif a.get("reused_from") is not None:
            how = f"duplicate proposal, result of #{a['reused_from']} reused"
        elif a.get("aborted"):
            how = "aborted early (cannot win)"
        elif a.get("failure"):
            how = f"infeasible: {a['failure']}"
        else:
            how = "baseline" if a.get("is_baseline") else "measured"
        if ps.get("restart"):
            restarts.append(ps["restart"])
        if first_within is None and value is not None and value >= 0.95 * HAND_PICKED_TOKS:
            first_within = t.number
        cells = [f"{ps.get(k, 0):.1f}" for k in ("restart", "warmup", "measure", "total")]
        shown = "-" if value is None else f"{value:.1f}"
        print(f"| #{t.number} | {shown} | {how} | {' | '.join(cells)} | {_flags(t.params)} |")
    best = best_estimate(study)
    assert best is not None
    print()
    print(
        f"restart (process start, weights on the GPU, /health 200): median "
        f"{statistics.median(restarts):.1f} s, range {min(restarts):.1f}-{max(restarts):.1f} s, "
        f"n={len(restarts)}"
    )
    print(f"first trial within 5% of the hand-picked {HAND_PICKED_TOKS} tok/s: #{first_within}")
    ms = ", ".join(f"{m.throughput:.1f}" for m in best.measurements if m.throughput)
    ci = "" if best.half_width is None else f"; 95% CI +- {best.half_width:.1f}"
    print(f"winner #{best.trial.number}: {best.mean:.1f} tok/s (measurements {ms}{ci})")
    total = sum(t.user_attrs.get("phase_seconds", {}).get("total", 0) for t in study.trials)
    print(f"time in trials: {total:.0f} s\n")


def check(study: optuna.Study) -> None:
    print(f"## {study.study_name}: side by side, one run\n")
    print("| configuration | runs (tok/s) | mean | vs default | vs hand-picked |")
    print("|---|---|---|---|---|")
    rows = []
    for est in config_estimates(study):
        attrs = study.trials[est.trial.number].user_attrs
        label = attrs.get("label") or ("default" if est.trial.is_baseline else "?")
        rows.append((label, [m.throughput for m in est.measurements if m.throughput]))
    means = {label: statistics.fmean(v) for label, v in rows}
    for label, values in rows:
        runs = ", ".join(f"{v:.1f}" for v in values)
        mean = means[label]
        print(
            f"| {label} | {runs} | {mean:.1f} | {mean / means['default']:.1f}x | "
            f"{mean / means['hand-picked']:.2f}x |"
        )
    print()


def replay_first_round_abort(study: optuna.Study) -> None:
    """When today's abort rule would have stopped the one-request-at-a-time trials: each is
    replayed as a server that finishes a request every 128 / (its measured tok/s) seconds,
    checked every ESTIMATE_INTERVAL_S against the incumbent the trial really had (#2)."""
    definition = load_study_definition(
        Path(__file__).parents[1] / "studies" / f"{study.study_name}.yaml"
    )
    settings = definition.early_abort
    assert settings is not None
    load = definition.load
    streams = LoadSpec(
        concurrency=load.concurrency, requests=load.requests, target_rel_ci=load.target_rel_ci
    ).streams
    best = best_estimate(study)
    assert best is not None
    incumbent = (float(study.trials[best.trial.number].values[0]), best.trial.number)
    print("## first-round abort, replayed\n")
    print("| trial | measured tok/s | measure phase then (s) | stops now after (s) |")
    print("|---|---|---|---|")
    saved = 0.0
    for t in study.trials:
        a = t.user_attrs
        if t.number <= incumbent[1] or not t.values or t.params.get("continuous_batching"):
            continue
        if t.params.get("compile") or a.get("reused_from") is not None:
            continue
        rate = t.values[0]
        per_request = load.output_len / rate
        elapsed = 0.0
        while True:
            elapsed += ESTIMATE_INTERVAL_S
            done = int(elapsed / per_request)
            estimate = LiveEstimate(
                elapsed_s=elapsed,
                completed=done,
                output_throughput=done * load.output_len / elapsed,
                rel_half_width=None,
            )
            why = early_abort_reason(
                estimate,
                settings=settings,
                incumbent=incumbent,
                streams=streams,
                output_len=load.output_len,
            )
            if why is not None:
                break
        then = a["phase_seconds"]["measure"]
        saved += then - elapsed
        print(f"| #{t.number} | {rate:.1f} | {then:.1f} | {elapsed:.2f} |")
    print(f"\nmeasure time saved: {saved:.0f} s\n")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tuned = _load("transformers-serve-h200")
    tuning(tuned)
    replay_first_round_abort(tuned)
    check(_load("transformers-serve-h200-check"))


if __name__ == "__main__":
    main()
