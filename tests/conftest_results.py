"""Factory for real Optuna studies (SQLite under tmp_path) that follow the stored trial schema.

Used by tests/test_results.py, tests/report/, tests/test_dashboard.py and (through
tests/export/conftest.py) tests/export/. Plain functions, not fixtures, so each test builds
exactly the study it needs.
"""

from __future__ import annotations

import random
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import StudyDirection
from optuna.trial import TrialState

PY = sys.executable
THROUGHPUT = "output_throughput_tok_s"
TPOT_P99 = "tpot_p99_ms"
FAILED_TPOT_MS = 1.0e6

DISTRIBUTIONS: dict[str, BaseDistribution] = {
    "nccl_proto": CategoricalDistribution(["unset", "LL", "LL128", "Simple"]),
    "moe_runner_backend": CategoricalDistribution(["marlin", "triton", "cutlass"]),
    "mem_fraction_static": FloatDistribution(0.70, 0.95, step=0.01),
    "max_running_requests": IntDistribution(8, 128, step=8),
    "cuda_graph": CategoricalDistribution([True, False]),
}

BASELINE_PARAMS: dict[str, Any] = {
    "nccl_proto": "unset",
    "moe_runner_backend": "marlin",
    "mem_fraction_static": 0.88,
    "max_running_requests": 48,
    "cuda_graph": True,
}


@dataclass
class TrialSpec:
    """What one stored trial looks like; defaults give a feasible measured trial."""

    throughput: float = 100.0
    tpot_p99_ms: float = 50.0
    params: dict[str, Any] = field(default_factory=lambda: dict(BASELINE_PARAMS))
    failure: str | None = None
    slo_violation: float = -1.0
    """slo_tpot_p99_ms constraint value (> 0 = violated)."""
    is_baseline: bool = False
    state: TrialState = TrialState.COMPLETE
    env: dict[str, str] | None = None
    extra_flags: list[str] = field(default_factory=list)
    phase_seconds: dict[str, float] | None = None
    config_extra: dict[str, Any] = field(default_factory=dict)
    """Merged into the stored ``config`` only (not a sampled parameter)."""
    services: dict[str, dict[str, Any]] | None = None
    """Replaces the default prefill/decode/router records."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """More stored user attributes (``capacity``: a capacity search's result)."""


def services(
    params: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    extra_flags: list[str] | None = None,
    python: str = PY,
) -> dict[str, dict[str, Any]]:
    """prefill, decode and a router that points at both (as the sim deployment runs them)."""
    out: dict[str, dict[str, Any]] = {}
    ports = {"prefill": 30000, "decode": 30001}
    for name, gpus in (("prefill", "0,1,2,3"), ("decode", "4,5,6,7")):
        argv = [
            python, "-m", "autotune.sim.server",
            "--model-path", "/models/DeepSeek-V4-Flash",
            "--disaggregation-mode", name,
            "--moe-runner-backend", str(params.get("moe_runner_backend", "marlin")),
            "--mem-fraction-static", str(params.get("mem_fraction_static", 0.88)),
            "--host", "127.0.0.1", "--port", str(ports[name]),
            *(extra_flags or []),
        ]  # fmt: skip
        service_env = {"CUDA_VISIBLE_DEVICES": gpus, **(env or {})}
        unset = ["NCCL_PROTO"] if params.get("nccl_proto", "unset") == "unset" else []
        if not unset:
            service_env["NCCL_PROTO"] = str(params["nccl_proto"])
        out[name] = record(argv, service_env, unset)
    router = [
        python, "-m", "sglang_router.launch_router", "--pd-disaggregation",
        "--prefill", "http://127.0.0.1:30000", "8998",
        "--decode", "http://127.0.0.1:30001",
        "--host", "127.0.0.1", "--port", "8000",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", "29000",
    ]  # fmt: skip
    out["router"] = record(router, {}, [])
    return out


def record(argv: list[str], env: dict[str, str], unset: list[str]) -> dict[str, Any]:
    parts: list[str] = []
    if env or unset:
        parts.append("env")
        for name in sorted(unset):
            parts += ["-u", name]
        parts += [f"{k}={v}" for k, v in sorted(env.items())]
    return {
        "command": shlex.join(parts + argv),
        "argv": argv,
        "env": env,
        "unset_env": unset,
        "fingerprint": f"{abs(hash((tuple(argv), tuple(sorted(env.items()))))):016x}"[:16],
    }


def metrics(throughput: float, tpot_p99_ms: float) -> dict[str, Any]:
    def dist(p99: float) -> dict[str, float]:
        return {"mean": p99 * 0.8, "p50": p99 * 0.75, "p90": p99 * 0.9, "p99": p99}

    return {
        "output_throughput": throughput,
        "total_throughput": throughput * 1.5,
        "request_throughput": throughput / 256,
        "ttft_ms": dist(200.0),
        "tpot_ms": dist(tpot_p99_ms),
        "itl_ms": dist(tpot_p99_ms),
        "e2e_ms": dist(tpot_p99_ms * 256),
        "error_rate": 0.0,
        "goodput": throughput / 256,
        "completed": 64,
        "failed": 0,
        "duration_s": 30.0,
    }


def frozen_trial(spec: TrialSpec, *, multi: bool) -> optuna.trial.FrozenTrial:
    failed = spec.failure is not None
    feasible_c = 1.0 if failed else 0.0
    slo_c = 1.0 if failed else spec.slo_violation
    if failed:
        values = [0.0, FAILED_TPOT_MS] if multi else [0.0]
    else:
        values = [spec.throughput, spec.tpot_p99_ms] if multi else [spec.throughput]
    config = dict(spec.params)
    config["speculative_num_draft_tokens"] = 4
    config.update(spec.config_extra)
    user_attrs: dict[str, Any] = {
        "config": config,
        "services": spec.services
        if spec.services is not None
        else services(spec.params, env=spec.env, extra_flags=spec.extra_flags),
        "metrics": {} if failed else metrics(spec.throughput, spec.tpot_p99_ms),
        "phase_seconds": spec.phase_seconds
        or {"restart": 40.0, "warmup": 5.0, "measure": 30.0, "tuner": 0.5},
        "failure": spec.failure,
        "reason": f"{spec.failure} while starting decode" if failed else "",
        "log_tail": "torch.OutOfMemoryError: CUDA out of memory" if failed else "",
        "is_baseline": spec.is_baseline,
        "reused_from": None,
        "effective": {},
        "overrides": [],
        "deployment": "sim-dsv4-flash-pd.yaml",
        "restarted": ["prefill", "decode", "router"],
        **spec.attrs,
    }
    complete = spec.state == TrialState.COMPLETE
    return optuna.trial.create_trial(
        state=spec.state,
        values=values if complete else None,
        params=spec.params,
        distributions={k: DISTRIBUTIONS[k] for k in spec.params},
        user_attrs=user_attrs,
        system_attrs={"constraints": [feasible_c, slo_c]} if complete else {},
        constraints={"feasible": feasible_c, "slo_tpot_p99_ms": slo_c} if complete else None,
    )


def make_study(
    tmp_path: Path,
    specs: list[TrialSpec],
    *,
    multi: bool = False,
    name: str = "autotune-test",
) -> optuna.Study:
    """A study in ``tmp_path/study.db`` holding the given trials, in order."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    directions = [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE][: 2 if multi else 1]
    study = optuna.create_study(storage=storage, study_name=name, directions=directions)
    study.set_metric_names([THROUGHPUT, TPOT_P99] if multi else [THROUGHPUT])
    study.add_trials([frozen_trial(s, multi=multi) for s in specs])
    return study


def typical_specs(n: int, *, seed: int = 0) -> list[TrialSpec]:
    """A baseline, then ``n - 1`` random trials: mostly measured, some crashed or over SLO."""
    rng = random.Random(seed)
    specs = [TrialSpec(throughput=25.0, tpot_p99_ms=510.0, is_baseline=True)]
    for i in range(1, n):
        params = {
            "nccl_proto": rng.choice(["unset", "LL", "LL128", "Simple"]),
            "moe_runner_backend": rng.choice(["marlin", "triton", "cutlass"]),
            "mem_fraction_static": round(rng.uniform(0.70, 0.95), 2),
            "max_running_requests": rng.randrange(8, 129, 8),
            "cuda_graph": rng.random() < 0.7,
        }
        kind = i % 7
        failure = "cuda_oom" if kind == 3 else ("nccl_error" if kind == 5 else None)
        thr = rng.uniform(20.0, 1200.0) * (1.5 if params["moe_runner_backend"] == "cutlass" else 1)
        specs.append(
            TrialSpec(
                throughput=round(thr, 1),
                tpot_p99_ms=round(rng.uniform(10.0, 600.0), 1),
                params=params,
                failure=failure,
                slo_violation=5.0 if kind == 6 else -1.0,
                phase_seconds={
                    "restart": rng.uniform(10, 60),
                    "warmup": rng.uniform(1, 5),
                    "measure": rng.uniform(20, 40),
                    "tuner": rng.uniform(0.05, 2),
                },
            )
        )
    return specs
