"""One configuration started once by autotune's LocalLauncher and measured by both load
generators: autotune's and ``vllm bench serve`` (the defaults and agreement arms)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.launch.local import LocalLauncher
from autotune.loadgen import run_load

from .processes import Processes
from .setup import Setup, run_vllm_bench


def _metrics_row(tool: str, seed: int, m: Any) -> dict[str, Any]:
    return {
        "tool": tool,
        "seed": seed,
        "output_throughput": m.output_throughput,
        "completed": m.completed,
        "failed": m.failed,
        "output_tokens": m.output_tokens,
        "input_tokens": m.input_tokens,
        "duration_s": m.duration_s,
        "ttft_p50_ms": m.ttft_ms.p50,
        "tpot_p50_ms": m.tpot_ms.p50,
    }


def _vllm_row(seed: int, data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "tool": "vllm bench serve",
        "seed": seed,
        "output_throughput": data.get("output_throughput"),
        "completed": data.get("completed"),
        "failed": data.get("failed"),
        "output_tokens": data.get("total_output_tokens"),
        "input_tokens": data.get("total_input_tokens"),
        "duration_s": data.get("duration"),
        "ttft_p50_ms": data.get("median_ttft_ms"),
        "tpot_p50_ms": data.get("median_tpot_ms"),
    }


class OneServer:
    """One configuration started once by autotune's LocalLauncher, measured by both tools."""

    def __init__(self, setup: Setup, procs: Processes, config: Mapping[str, Any], d: Path):
        self.setup, self.procs, self.d = setup, procs, d
        self.run_dir = d / "run"
        self.dep, self.spec, self.specs, self.url = setup.specs(config, self.run_dir)
        self.model = self.dep.model
        self.launcher: LocalLauncher | None = None
        self.start_s = 0.0

    def __enter__(self) -> OneServer:
        self.launcher = self.procs.launcher(self.run_dir)
        t0 = time.monotonic()
        print(f"  starting: {self.spec.command_line()}", flush=True)
        self.launcher.apply(self.specs, deadline=t0 + self.spec.ready_timeout_s)
        self.start_s = time.monotonic() - t0
        print(f"  healthy after {self.start_s:.0f} s at {self.url}", flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.launcher is not None:
            self.procs.release(self.launcher)
            self.launcher = None

    def autotune_load(self, seed: int) -> dict[str, Any]:
        result = run_load(self.url, self.setup.load_spec(seed, self.model))
        row = _metrics_row("autotune loadgen", seed, result.metrics)
        print(f"    autotune loadgen (seed {seed}): {row['output_throughput']:.1f} tok/s")
        return row

    def vllm_load(self, seed: int, name: str) -> dict[str, Any]:
        cmd = self.setup.vllm_bench(self.url, self.spec, self.model or "", seed)
        data = run_vllm_bench(
            self.procs,
            cmd,
            self.d / f"{name}.json",
            self.setup.bench_env(self.run_dir),
            self.d / "vllm-bench.log",
        )
        row = _vllm_row(seed, data)
        print(f"    vllm bench serve (seed {seed}): {row['output_throughput']:.1f} tok/s")
        return row
