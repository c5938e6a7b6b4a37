"""The simulated deployment: SGLang-compatible HTTP servers driven by a performance model.

``python -m autotune.sim.server`` (prefill/decode/null) is started with the same flags and
environment a real SGLang PD deployment gets, behind the real SGLang PD router
(``python -m sglang_router.launch_router``, PyPI sglang-router); its speed, memory failures
and silent rewrites follow ``perf_model`` (see docs/performance-model.md).
Kept import-light: nothing here pulls in aiohttp.
"""

from __future__ import annotations

from autotune.sim.args import SimConfig, parse_config
from autotune.sim.levers import (
    BASELINE,
    config_from_levers,
    levers_to_command,
    sample_levers,
)
from autotune.sim.optimum import true_optimum
from autotune.sim.perf_model import (
    StartupFailure,
    expected_output_throughput,
    expected_tpot_ms,
    resolve,
    serves_wrong_text,
    startup_failure,
)

__all__ = [
    "BASELINE",
    "SimConfig",
    "StartupFailure",
    "config_from_levers",
    "expected_output_throughput",
    "expected_tpot_ms",
    "levers_to_command",
    "parse_config",
    "resolve",
    "sample_levers",
    "serves_wrong_text",
    "startup_failure",
    "true_optimum",
]
