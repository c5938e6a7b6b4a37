"""The defaults arm: vLLM as shipped (the space's baseline command) started once, measured
``--defaults-runs`` times by autotune's load generator and once by ``vllm bench serve``."""

from __future__ import annotations

import statistics
import time
from typing import Any

from .one_server import OneServer
from .processes import Processes
from .setup import Setup, fresh_dir


def arm_defaults(setup: Setup, procs: Processes, runs: int) -> dict[str, Any]:
    d = fresh_dir(setup.out / "defaults")
    t0 = time.monotonic()
    with OneServer(setup, procs, setup.baseline, d) as server:
        rows = [server.autotune_load(setup.seed + i) for i in range(runs)]
        vllm_rows = [server.vllm_load(setup.seed, "vllm-bench-0")]
        start_s = server.start_s
    values = [r["output_throughput"] for r in rows]
    return {
        "arm": "defaults",
        "restarts": 1,
        "wall_s": time.monotonic() - t0,
        "start_s": start_s,
        "command": server.spec.command_line(),
        "autotune_runs": rows,
        "vllm_bench_runs": vllm_rows,
        "best": {
            "tok_s": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "vllm_bench_tok_s": vllm_rows[0]["output_throughput"],
            "changed": {},
        },
    }
