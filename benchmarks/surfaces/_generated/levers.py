"""Levers: one parameter's domain and target, their constructors, and the pools the generator
draws levers from."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------- levers


def _places(number: float) -> int:
    text = repr(float(number))
    return len(text.split(".")[1].rstrip("0")) if "." in text and "e" not in text else 0


@dataclass
class Lever:
    """One parameter: its domain (``values``, indexed by code) and where it goes."""

    name: str
    kind: str  # categorical | int | float | bool
    values: tuple[Any, ...]
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False
    when: str | None = None
    target: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.values)

    def spec(self) -> dict[str, Any]:
        """The parameter as a space file writes it."""
        out: dict[str, Any] = {"type": self.kind}
        if self.kind == "categorical":
            out["choices"] = list(self.values)
        elif self.kind in ("int", "float"):
            cast = int if self.kind == "int" else float
            out["low"], out["high"] = cast(self.low), cast(self.high)
            if self.step is not None:
                out["step"] = cast(self.step)
            if self.log:
                out["log"] = True
        if self.when is not None:
            out["when"] = self.when
        out["target"] = dict(self.target)
        return out

    def probs(self) -> np.ndarray:
        """P(each value) under ``random_config`` (Optuna's RandomSampler)."""
        if self.kind == "int" and self.log:
            v = np.asarray(self.values, dtype=float)
            lo = np.log(np.maximum(v - 0.5, self.low))
            hi = np.log(np.minimum(v + 0.5, self.high))
            return (hi - lo) / (math.log(self.high) - math.log(self.low))
        return np.full(self.n, 1.0 / self.n)

    def unit(self) -> np.ndarray:
        """Each value's position in its range, 0..1 (by log for log levers, by index for
        categorical and bool)."""
        if self.kind in ("int", "float"):
            v = np.asarray(self.values, dtype=float)
            if self.log:
                return (np.log(v) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
            return (v - self.low) / (self.high - self.low)
        return np.arange(self.n) / max(1, self.n - 1)

    def code(self, value: Any) -> int:
        """The index of a (normalised) value."""
        if self.kind == "float":
            assert self.step is not None
            return int(round((float(value) - self.low) / self.step))
        if self.kind == "int":
            return (
                int(value) - int(self.low)
                if self.log
                else (int(value) - int(self.low)) // int(self.step or 1)
            )
        for i, choice in enumerate(self.values):
            if choice == value and type(choice) is type(value):
                return i
        raise KeyError(f"{value!r} is not a value of {self.name}")


def _flag(name: str) -> dict[str, Any]:
    return {"flag": "--" + name.replace("_", "-")}


def _cat(name: str, choices: Sequence[Any]) -> Lever:
    return Lever(name, "categorical", tuple(choices), target=_flag(name))


def _bool(name: str, *, switch: bool = True) -> Lever:
    target = {"switch": "--" + name.replace("_", "-")} if switch else _flag(name)
    return Lever(name, "bool", (False, True), target=target)


def _int(name: str, low: int, high: int, step: int = 1) -> Lever:
    values = tuple(range(low, high + 1, step))
    return Lever(name, "int", values, low, high, step, target=_flag(name))


def _logint(name: str, low: int, high: int) -> Lever:
    return Lever(
        name, "int", tuple(range(low, high + 1)), low, high, None, True, target=_flag(name)
    )


def _float(name: str, low: float, high: float, step: float) -> Lever:
    places = max(_places(low), _places(step))
    count = int(round((high - low) / step)) + 1
    values = tuple(round(low + k * step, places) for k in range(count))
    return Lever(name, "float", values, low, high, step, target=_flag(name))


# Pools the generator draws levers from (names only set the scene; roles set the effects).
MEM_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _float("mem_fraction_static", 0.70, 0.96, 0.02),
    lambda: _float("gpu_memory_utilization", 0.60, 0.95, 0.05),
    lambda: _int("kv_cache_gb", 8, 96, 8),
    lambda: _int("kv_cache_blocks", 1024, 16384, 1024),
)
BATCH_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _int("max_running_requests", 16, 256, 16),
    lambda: _int("max_num_seqs", 32, 384, 32),
    lambda: _int("max_batch_size", 8, 128, 8),
    lambda: _int("decode_batch", 4, 64, 4),
)
CAT_POOL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention_backend", ("flashinfer", "triton", "fa3", "cutlass_mla", "trtllm_mha", "torch")),
    ("moe_runner_backend", ("auto", "triton", "deep_gemm", "cutlass", "trtllm", "marlin")),
    ("all_reduce_impl", ("nccl", "custom", "one_shot", "two_shot", "symm_mem", "mscclpp")),
    ("nccl_proto", ("Simple", "LL", "LL128", "auto")),
    ("cuda_graph_mode", ("none", "piecewise", "full", "full_decode_only", "mixed")),
    ("kv_layout", ("NHD", "HND", "paged_nhd", "paged_hnd", "ragged")),
    ("schedule_policy", ("fcfs", "lpm", "dfs_weight", "lof", "random", "priority")),
    ("sampling_backend", ("pytorch", "flashinfer", "triton", "fused")),
)
TRAP_POOL: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("fast_math_approx", None),
    ("approximate_softmax", None),
    ("kv_cache_dtype", ("auto", "fp8_e4m3", "fp4_e2m1")),
    ("weight_format", ("bf16", "fp8", "nvfp4")),
    ("logits_precision", ("fp32", "bf16", "fp8_lossy")),
)
GATE_POOL: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("speculative_decoding", None),
    ("speculative_algorithm", ("off", "ngram", "eagle")),
    ("speculative_algorithm", ("off", "ngram", "eagle", "mtp")),
)
MAIN_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _cat("chunked_prefill_size", (1024, 2048, 4096, 8192, 16384)),
    lambda: _cat("tokenizer_pool", ("none", "thread", "process")),
    lambda: _logint("stream_interval", 1, 32),
    lambda: _logint("omp_num_threads", 1, 64),
    lambda: _logint("num_continuous_decode_steps", 1, 16),
    lambda: _int("nccl_nchannels", 4, 32, 4),
    lambda: _int("max_prefill_tokens", 4096, 32768, 4096),
    lambda: _float("schedule_conservativeness", 0.3, 1.5, 0.1),
    lambda: _float("prefill_priority", 0.0, 1.0, 0.05),
    lambda: _bool("enable_prefix_caching"),
    lambda: _bool("overlap_schedule"),
    lambda: _bool("enable_mixed_chunk"),
)
INERT_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _cat("log_level", ("debug", "info", "warning", "error")),
    lambda: _bool("enable_metrics"),
    lambda: _int("watchdog_timeout", 60, 600, 60),
    lambda: _float("api_timeout_s", 10.0, 60.0, 5.0),
    lambda: _logint("decode_log_interval", 1, 1000),
)
CHILD2_POOL: tuple[Callable[[], Lever], ...] = (
    lambda: _float("kernel_tile_scale", 0.25, 2.0, 0.25),
    lambda: _int("kernel_split", 1, 8),
)
