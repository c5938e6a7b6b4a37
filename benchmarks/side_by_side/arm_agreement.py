"""The agreement arm: autotune's winner started once more, then autotune's load generator and
``vllm bench serve`` alternating on that one server with the same load, a new prompt seed per
round for both (no prefix-cache hits across rounds). Reports the relative difference of the
means and what each counts: completed requests, output tokens (both from the server's
``usage``), duration (autotune: first dispatch of a measured request to the last completion;
``vllm bench serve``: ``benchmark_start_time`` just before its dispatch loop to the end of
``asyncio.gather``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

from .arm_autotune import STUDY_NAME
from .one_server import OneServer
from .processes import Processes
from .setup import Setup, changed, fresh_dir


def winner_config(
    setup: Setup,
    results: Mapping[str, Any],
    storage: str | None = None,
    study_name: str | None = None,
) -> tuple[dict[str, Any], int]:
    """autotune's winner: from ``storage``'s study ``study_name`` (``--winner-from``, e.g.
    the H200's stored dense study) if given, else from this run's autotune arm, else from
    OUT/autotune's study."""
    arm = results.get("autotune") or {}
    if storage is None and arm.get("best"):
        return dict(arm["best"]["config"]), int(arm["best"]["trial"])
    if storage is None:
        db = setup.out / "autotune" / "autotune.db"
        if not db.is_file():
            raise SystemExit(
                f"agreement needs autotune's winner: run --arms autotune first ({db}) "
                "or give --winner-from"
            )
        storage = f"sqlite:///{db}"
    import optuna

    from autotune.results import best_estimate

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = study_name or STUDY_NAME
    est = best_estimate(optuna.load_study(study_name=name, storage=storage))
    if est is None:
        raise SystemExit(f"no feasible trial in {name} ({storage})")
    return dict(est.trial.config), est.trial.number


def arm_agreement(
    setup: Setup,
    procs: Processes,
    rounds: int,
    results: Mapping[str, Any],
    *,
    winner_from: str | None = None,
    winner_study: str | None = None,
) -> dict[str, Any]:
    config, trial = winner_config(setup, results, winner_from, winner_study)
    d = fresh_dir(setup.out / "agreement")
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    with OneServer(setup, procs, config, d) as server:
        for i in range(rounds):
            seed = setup.seed + 100 + i
            order = ("autotune", "vllm") if i % 2 == 0 else ("vllm", "autotune")
            for tool in order:
                row = (
                    server.autotune_load(seed)
                    if tool == "autotune"
                    else server.vllm_load(seed, f"vllm-bench-{i}")
                )
                rows.append({"round": i, **row})
        command = server.spec.command_line()
    a = [r["output_throughput"] for r in rows if r["tool"] == "autotune loadgen"]
    v = [r["output_throughput"] for r in rows if r["tool"] == "vllm bench serve"]
    mean_a, mean_v = statistics.fmean(a), statistics.fmean(v)

    def per(tool: str, key: str) -> float:
        return statistics.fmean(float(r[key]) for r in rows if r["tool"] == tool)

    return {
        "arm": "agreement",
        "winner_trial": trial,
        "winner_from": winner_from,
        "winner_study": winner_study,
        "config": config,
        "changed": changed(config, setup.baseline),
        "command": command,
        "restarts": 1,
        "wall_s": time.monotonic() - t0,
        "runs": rows,
        "autotune_mean": mean_a,
        "vllm_mean": mean_v,
        "autotune_sd": statistics.stdev(a) if len(a) > 1 else None,
        "vllm_sd": statistics.stdev(v) if len(v) > 1 else None,
        "rel_diff": (mean_v - mean_a) / mean_a,
        "within_2pct": abs(mean_v - mean_a) / mean_a <= 0.02,
        "means": {
            tool: {
                k: per(tool, k)
                for k in (
                    "completed",
                    "output_tokens",
                    "input_tokens",
                    "duration_s",
                    "ttft_p50_ms",
                    "tpot_p50_ms",
                )
            }
            for tool in ("autotune loadgen", "vllm bench serve")
        },
    }
