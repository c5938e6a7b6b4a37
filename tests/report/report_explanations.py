"""A stored explanation to render: effects with intervals, a path, a minimal winner, as
`autotune explain` stores them (the explanation and curve tests of the report use it)."""

from __future__ import annotations

from typing import Any

import optuna
from conftest_results import BASELINE_PARAMS

from autotune.explain import Effect, Explanation, Interval, Measured, Minimal, PathStep
from autotune.explain.record import RESULT_ATTR, Decision
from autotune.results import best_estimate

MOE = "moe_runner_backend"
OOM = "cuda_oom: CUDA out of memory while capturing graphs"


def measured(key: str, mean: float, half: float | None, n: int = 3) -> Measured:
    values = [mean + d for d in (-1.0, 1.0, 0.0)[:n]]
    return Measured(
        key=key,
        n=n,
        values=values,
        mean=Interval(
            value=mean,
            low=None if half is None else mean - half,
            high=None if half is None else mean + half,
        ),
    )


def iv(value: float, low: float, high: float) -> Interval:
    return Interval(value=value, low=low, high=high)


def effect(
    change: str,
    levers: dict[str, tuple[Any, Any]],
    without: Measured,
    contribution: Interval | None,
    **extra: Any,
) -> Effect:
    return Effect(
        change=change,
        levers=list(levers),
        baseline={k: b for k, (b, _) in levers.items()},
        winner={k: w for k, (_, w) in levers.items()},
        reverted=[change],
        without=without,
        contribution=contribution,
        relative=None if contribution is None else contribution.value / 1000.0,
        **extra,
    )


def an_explanation(winner: int, *, moe: str = MOE) -> Explanation:
    """Four changes from a baseline at 400 to a winner at 1000: cuda_graph is required (the
    winner without it runs out of memory), ``moe`` bought 400, mem_fraction_static 100 and
    nccl_proto (reverted with a partner: alone is forbidden) 10; the path adds them in that
    order; the minimal winner drops nccl_proto."""
    effects = [
        effect(
            "cuda_graph",
            {"cuda_graph": (True, False)},
            Measured(key="k-cg", failure=OOM),
            None,
            required=True,
        ),
        effect(
            moe, {MOE: ("marlin", "cutlass")}, measured("k-moe", 600.0, 25.0, 2), iv(400, 360, 440)
        ),
        effect(
            "mem_fraction_static",
            {"mem_fraction_static": (0.88, 0.93)},
            measured("k-mem", 900.0, 27.0, 2),
            iv(100, 40, 160),
        ),
        effect(
            "nccl_proto",
            {"nccl_proto": ("unset", "LL")},
            measured("k-nccl", 990.0, 28.0, 2),
            iv(10, -50, 70),
            note="reverting nccl_proto alone is refused (forbidden combination); reverted "
            "together with mem_fraction_static",
        ),
    ]
    win = measured("k-win", 1000.0, 30.0)
    path = [
        PathStep(added=["cuda_graph"], measured=measured("p1", 380.0, 19.0), step=iv(-20, -47, 7)),
        PathStep(added=[moe], measured=measured("p2", 760.0, 30.0), step=iv(380, 340, 420)),
        PathStep(
            added=["mem_fraction_static"],
            measured=measured("p3", 980.0, 30.0),
            step=iv(220, 180, 260),
        ),
        PathStep(added=["nccl_proto"], measured=win, step=iv(20, -20, 60)),
    ]
    decisions = [
        Decision(
            change="nccl_proto",
            action="dropped",
            why="without it 985.0 (n=3, lower bound 956.0), within 3% of the winner's lower "
            "bound 970.0",
        ),
        Decision(
            change="mem_fraction_static",
            action="kept",
            why="without it 890.0 (n=3), below 97% of the winner's lower bound 970.0",
        ),
        Decision(change=moe, action="kept", why="without it 590.0 (n=2), below 97%"),
        Decision(change="cuda_graph", action="kept", why=f"the winner without it fails ({OOM})"),
    ]
    kept = ["cuda_graph", moe, "mem_fraction_static"]
    return Explanation(
        winner=winner,
        unit="tok/s",
        objective="output throughput",
        tolerance=0.03,
        winner_config={**BASELINE_PARAMS, MOE: "cutlass", "cuda_graph": False},
        baseline_config=dict(BASELINE_PARAMS),
        winner_measured=win,
        baseline_measured=measured("k-base", 400.0, 20.0, 2),
        noise_sd=0.02,
        noise_df=20,
        effects=effects,
        path=path,
        minimal=Minimal(
            kept=kept,
            dropped=["nccl_proto"],
            config={**BASELINE_PARAMS, MOE: "cutlass", "cuda_graph": False},
            measured=measured("k-min", 985.0, 29.0),
            ratio=iv(0.985, 0.95, 1.02),
            decisions=decisions,
            complete=True,
        ),
        runs=26,
        complete=True,
    )


def explained(study: optuna.Study, **kwargs: Any) -> Explanation:
    """Store an explanation of the study's winner, as `autotune explain` does."""
    estimate = best_estimate(study)
    assert estimate is not None
    expl = an_explanation(estimate.trial.number, **kwargs)
    study.set_user_attr(RESULT_ATTR, expl.model_dump(mode="json"))
    return expl
