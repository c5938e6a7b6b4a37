"""Levers and the performance model's figures for them, shared by the perf-model tests
(test_perf_model.py, test_perf_resolution.py, test_perf_startup.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.sim import perf_model as pm
from autotune.sim.args import SimConfig, parse_config
from autotune.sim.levers import (
    BASELINE,
    levers_to_command,
    pd_configs,
)

IN, OUT = 1024, 256
NVFP4 = {**BASELINE, "checkpoint": "nvfp4", "moe_runner_backend": "flashinfer_cutlass"}
FAST = {
    **NVFP4,
    "sm120_flashmla_backend": "flashinfer",
    "speculative": "off",
    "cuda_graph_max_bs_decode": 16,
    "pcie_ipc_allreduce": True,
}


def thr(levers: Mapping[str, object], i: int = IN, o: int = OUT) -> float:
    pre, dec = pd_configs(levers)
    return pm.expected_output_throughput(dec, prefill=pre, input_len=i, output_len=o)


def tpot(levers: Mapping[str, object], i: int = IN, o: int = OUT) -> float:
    pre, dec = pd_configs(levers)
    return pm.expected_tpot_ms(dec, prefill=pre, input_len=i, output_len=o)


def served(
    levers: Mapping[str, object],
    mode: str,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> SimConfig:
    """What a server of ``mode`` parses from the levers' command plus ``extra`` flags."""
    argv, lever_env = levers_to_command(levers, mode=mode)
    return parse_config([*argv, *extra], {**lever_env, **(env or {})})


def pd_thr(
    levers: Mapping[str, object],
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> float:
    """Throughput when both servers get ``extra`` flags and ``env`` on top of the levers."""
    pre = served(levers, "prefill", extra, env)
    dec = served(levers, "decode", extra, env)
    return pm.expected_output_throughput(dec, prefill=pre, input_len=IN, output_len=OUT)
