"""The closed-loop steady state a load generator at concurrency C measures: decode residence,
the FIFO prefill queue (Kingman's formula), the mean running batch found by bisection, and the
output throughput, TPOT and TTFT that follow.

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §6). The top of the model: it
only combines the start-up, running-cap, acceptance, decode-step and prefill figures of the
modules below it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

from autotune.sim._perf_decode import accept_length, decode_step_seconds
from autotune.sim._perf_memory import running_cap, startup_failure
from autotune.sim._perf_prefill import prompt_prefill_seconds
from autotune.sim._perf_resolution import _resolve
from autotune.sim.args import SimConfig

# ----------------------------------------------------------------------------------------
# Closed-loop expectations (what a load generator at concurrency C measures)
# ----------------------------------------------------------------------------------------
ROUTER_OVERHEAD_SECONDS = 1.5e-3  # [estimate] two extra HTTP hops through the PD router
CLIENT_OVERHEAD_SECONDS = 0.5e-3  # [estimate] one HTTP request/response
# [calibrated against the simulator's own PD closed loop] FIFO prefill queue, Kingman's
# G/D/1: closed-loop arrivals are more regular than Poisson (squared CV 0.6)
PREFILL_ARRIVAL_SCV = 0.6
PREFILL_MAX_UTILISATION = 0.98


@lru_cache(maxsize=8192)
def as_mode(cfg: SimConfig, mode: str) -> SimConfig:
    """The same configuration seen by a server of another disaggregation mode."""
    return dataclasses.replace(cfg, disaggregation_mode=mode)


def _steps_for(acc: float, output_len: int) -> float:
    return 1.0 + max(0, output_len - 1) / acc


@dataclass(frozen=True)
class Expectation:
    """Steady-state figures of a closed loop of ``concurrency`` clients."""

    output_throughput: float  # tokens/s
    tpot_s: float
    ttft_s: float
    batch: float  # mean running requests in the decode server
    step_s: float


def expectation(
    cfg: SimConfig,
    *,
    concurrency: int = 16,
    input_len: int,
    output_len: int,
    deployment: str = "pd",
    prefill: SimConfig | None = None,
    shared_prefix: int = 0,
) -> Expectation:
    """Closed-form steady state. ``deployment``: ``pd`` (router -> prefill -> decode) or
    ``decode`` (clients hit the decode server). The decode server is ``cfg`` in decode mode;
    the prefill server is ``prefill`` (in prefill mode), by default ``cfg`` in prefill mode.
    ``shared_prefix``: the first tokens of every prompt that the prefill's radix cache holds
    in the steady state (a shared system prompt that fits in the cache); 0 for random
    prompts."""
    dec = as_mode(cfg, "decode")
    failed = startup_failure(dec) is not None
    if deployment == "pd":
        pre = as_mode(prefill if prefill is not None else cfg, "prefill")
        failed = failed or startup_failure(pre) is not None
        p_service = prompt_prefill_seconds(pre, input_len, shared_prefix=shared_prefix)
        overhead = ROUTER_OVERHEAD_SECONDS + CLIENT_OVERHEAD_SECONDS
        by_prefill = _resolve(pre).spec
    else:
        p_service = 0.0
        overhead = CLIENT_OVERHEAD_SECONDS
        by_prefill = False
    if failed or concurrency < 1 or output_len < 1:
        return Expectation(0.0, math.inf, math.inf, 0.0, math.inf)
    cap = running_cap(dec)
    acc = accept_length(dec, seeded=by_prefill)
    steps = _steps_for(acc, output_len)
    c = float(concurrency)

    def cycle(b: float) -> tuple[float, float, float]:
        """(decode residence, prefill residence with FIFO queueing, the batch they imply)."""
        r_dec = (steps + 0.5) * decode_step_seconds(dec, b)  # +half a step: join boundary
        rho = min(PREFILL_MAX_UTILISATION, b / r_dec * p_service)
        wait = PREFILL_ARRIVAL_SCV / 2.0 * rho / (1.0 - rho) * p_service  # Kingman, cs^2=0
        p_tot = overhead + p_service + wait
        return r_dec, p_tot, min(float(cap), c * r_dec / (p_tot + r_dec))

    hi = float(min(c, cap))
    if cycle(hi)[2] >= hi - 1e-9:
        b = hi  # decode saturated at its cap (or every client is decoding)
    else:  # bisection on B = C * R(B) / (P + R(B)), monotone in B
        lo = 0.0
        while hi - lo > 1e-4 * max(1.0, hi):
            mid = 0.5 * (lo + hi)
            if cycle(max(mid, 1e-6))[2] > mid:
                lo = mid
            else:
                hi = mid
        b = max(0.5 * (lo + hi), 1e-6)
    r_dec, p_total, _ = cycle(b)
    step = decode_step_seconds(dec, b)
    x = b / r_dec  # requests/s
    if p_service > 0 and x * p_service > 1.0:
        # FIFO prefill is the bottleneck: one request per p_service, fewer in decode
        x = 1.0 / p_service
        b = min(b, x * r_dec)
        step = decode_step_seconds(dec, b)
        r_dec = (steps + 0.5) * step
    tpot = step / acc
    ttft = c / x - r_dec + 1.5 * step
    return Expectation(
        output_throughput=x * output_len,
        tpot_s=tpot,
        ttft_s=max(0.0, ttft),
        batch=b,
        step_s=step,
    )


def expected_output_throughput(
    cfg: SimConfig,
    *,
    concurrency: int = 16,
    input_len: int,
    output_len: int,
    deployment: str = "pd",
    prefill: SimConfig | None = None,
    shared_prefix: int = 0,
) -> float:
    """Output tokens/s a closed loop of ``concurrency`` clients measures (0 if it fails)."""
    return expectation(
        cfg,
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        deployment=deployment,
        prefill=prefill,
        shared_prefix=shared_prefix,
    ).output_throughput


def expected_tpot_ms(
    cfg: SimConfig,
    *,
    concurrency: int = 16,
    input_len: int,
    output_len: int,
    deployment: str = "pd",
    prefill: SimConfig | None = None,
    shared_prefix: int = 0,
) -> float:
    """Mean time per output token after the first, in milliseconds (inf if it fails)."""
    return (
        1000.0
        * expectation(
            cfg,
            concurrency=concurrency,
            input_len=input_len,
            output_len=output_len,
            deployment=deployment,
            prefill=prefill,
            shared_prefix=shared_prefix,
        ).tpot_s
    )
