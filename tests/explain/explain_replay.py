"""A faithful replay of the explain loop (:mod:`autotune.study.explainer`) without servers.

A "measurement" is a known pure function of the configuration (the truth) times seeded
multiplicative noise; what the loop would store in the study (the runs, the state) is kept
in a dict and round-tripped through JSON, as the study attributes are. The noise of run
``I`` of configuration ``KEY`` depends on (seed, KEY, I) only, so an interrupted replay that
resumes measures exactly what an uninterrupted one does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.explain import (
    Decide,
    ExplainRun,
    ExplainSettings,
    ExplainState,
    Explanation,
    Finished,
    Measure,
    Planner,
)
from autotune.explain.changes import ChangeSet
from autotune.space import SearchSpace
from autotune.telemetry.model import GpuTelemetry, Telemetry

Config = dict[str, object]
Truth = Callable[[Config], "float | tuple[float, bool] | None"]
"""The true objective of a configuration; None: it fails to start (an OOM); a pair: the
value and whether every SLO held."""


@dataclass
class Replay:
    runs: dict[str, list[ExplainRun]]
    state: ExplainState
    measured: list[Measure] = field(default_factory=list)
    """What this replay measured, in order."""
    decided: list[str] = field(default_factory=list)
    finished: str | None = None
    """Finished's reason; None when the budget stopped it."""


def planner_for(
    space: SearchSpace, winner: Config, settings: ExplainSettings | None = None
) -> Planner:
    changes = ChangeSet(space, baseline=space.baseline_params(), winner=winner)
    return Planner(changes, settings or ExplainSettings(), winner=7)


def _telemetry(machine: str | None) -> Telemetry | None:
    """What NVML would record of a run on the GPU ``machine`` (its UUID): enough to tell
    the machines apart."""
    if machine is None:
        return None
    return Telemetry(source="nvml", gpus=[GpuTelemetry(index=0, uuid=machine, name="H100")])


def measure(
    truth: Truth,
    step: Measure,
    index: int,
    *,
    seed: int,
    noise: float,
    machine: str | None = None,
    speed: float = 1.0,
    at: float | None = None,
) -> ExplainRun:
    """One run: ``truth`` x seeded noise x ``speed`` (the machine's, against the truth),
    on the GPU ``machine`` (None: no GPU telemetry), stored at ``at``."""
    true = truth(step.config)
    if true is None:
        return ExplainRun(
            key=step.key,
            index=index,
            config=step.config,  # type: ignore[arg-type]
            failure="cuda_oom",
            reason="CUDA out of memory",
            telemetry=_telemetry(machine),
            measured_at=at,
        )
    value, feasible = true if isinstance(true, tuple) else (true, True)
    rng = random.Random(f"{seed}:{step.key}:{index}")
    noisy = speed * value * math.exp(rng.gauss(0.0, noise))
    return ExplainRun(
        key=step.key,
        index=index,
        config=step.config,  # type: ignore[arg-type]
        values=[noisy],
        feasible=feasible,
        telemetry=_telemetry(machine),
        measured_at=at,
    )


def _stored(runs: dict[str, list[ExplainRun]]) -> dict[str, list[ExplainRun]]:
    """The runs as ``load_runs`` gives them back: through JSON, sorted by index."""
    out: dict[str, list[ExplainRun]] = {}
    for key, rs in runs.items():
        out[key] = sorted(
            (ExplainRun.model_validate(r.model_dump(mode="json")) for r in rs),
            key=lambda r: r.index,
        )
    return out


def replay(
    planner: Planner,
    truth: Truth,
    *,
    seed: int = 0,
    noise: float = 0.02,
    runs: dict[str, list[ExplainRun]] | None = None,
    state: ExplainState | None = None,
    budget: int | None = None,
    max_steps: int = 2000,
    machine: str | None = None,
    speed: float = 1.0,
) -> Replay:
    """What ``Explainer.run`` does, step for step: ask, store a decision, check the budget
    (total measurements of this explanation, as ``ExplainSettings.budget``), measure (on
    the GPU ``machine`` at ``speed``: :func:`measure`; each run stored one second after
    the latest stored)."""
    runs = _stored(runs or {})
    state = state if state is not None else planner.new_state()
    out = Replay(runs=runs, state=state)
    for _ in range(max_steps):
        step = planner.next(_stored(runs), state)
        if isinstance(step, Finished):
            out.finished = step.why
            break
        if isinstance(step, Decide):
            state = ExplainState.model_validate(step.state.model_dump(mode="json"))
            out.decided.append(step.message)
            continue
        assert isinstance(step, Measure)
        if budget is not None and state.runs >= budget:
            break
        index = len(runs.get(step.key, ()))
        at = 1.0 + max((r.measured_at or 0.0 for rs in runs.values() for r in rs), default=0.0)
        runs.setdefault(step.key, []).append(
            measure(truth, step, index, seed=seed, noise=noise, machine=machine, speed=speed,
                    at=at)
        )  # fmt: skip
        state = state.model_copy(update={"runs": state.runs + 1})
        out.measured.append(step)
    else:
        raise AssertionError(f"the plan did not finish in {max_steps} steps")
    out.runs, out.state = runs, state
    return out


def explain(planner: Planner, result: Replay) -> Explanation:
    return planner.explanation(
        _stored(result.runs), result.state, unit="tok/s", objective="output throughput"
    )
