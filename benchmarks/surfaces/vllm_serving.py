"""vLLM serving a 70B dense model on one 8x80 GB node, 64 clients, 1,024 in / 256 out: tok/s.

A synthetic surface for ``benchmarks/sample_efficiency.py`` with the traits of a serving
deployment other than the bundled one: tensor parallelism trades replicas for memory (BF16
weights do not fit one GPU, FP8/AWQ weights leave little KV cache at TP1), the KV capacity
caps the batch, speculative depth pays less as the batch grows, CUDA graphs only cover
batches up to the capture size, chunked prefill overlaps prefill with memory-bound decode.
Crashes (at launch): ``cuda_oom`` when the weights do not fit or the memory left outside
``gpu_memory_utilization`` cannot hold the CUDA graphs and NCCL buffers;
``config_rejected`` when the KV cache cannot hold one 4,096-token sequence. Wrong output:
an FP8 KV cache read by FlashAttention. Forbidden rules are in ``vllm_serving.yaml``. The
formula is vectorised with numpy so that ``true_optimum`` enumerates all 760,320
combinations exactly in about a second.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

GPUS = 8
GPU_BYTES = 80e9
CLIENTS, INPUT, OUTPUT = 64, 1024, 256
MAX_MODEL_LEN = 4096
PARAMS = 70e9
LAYERS, HIDDEN = 80, 8192
KV_BYTES_PER_TOKEN = 80 * 8 * 128 * 2 * 2  # layers x kv heads x head dim x (k, v) x bf16
HBM = 3.35e12
PEAK_BF16 = 990e12
BYTES_PER_PARAM = (2.0, 1.0, 0.55)  # bf16, fp8, awq_int4
COMPUTE_SCALE = (1.0, 2.0, 0.7)  # fp8 tensor cores; AWQ dequantises to bf16
ALLREDUCE_S = {1: 0.0, 2: 8e-6, 4: 11e-6, 8: 16e-6}
QUANT = ("bf16", "fp8", "awq_int4")
SPEC = ("off", "ngram", "eagle")
ACCEPT = (0.0, 0.35, 0.75)  # first-token acceptance; each later token x0.9

TP = (1, 2, 4, 8)
UTIL = tuple(round(0.70 + 0.04 * i, 2) for i in range(8))
SEQS = (32, 64, 96, 128, 160, 192)
CHUNKS = (1024, 2048, 4096, 8192, 16384)
SPEC_TOKENS = (1, 2, 3, 4, 5)
CAPTURE = (64, 128, 256, 512)
BACKENDS = ("flash_attn", "flashinfer")


@dataclass(frozen=True)
class Result:
    """One launch: the score (tok/s), its TPOT, or why it failed."""

    value: float = 0.0
    latency_ms: float | None = None
    failure: str | None = None
    reason: str = ""


def _forbidden(quant: Any, tp: Any, spec: Any) -> Any:
    """The rules of ``vllm_serving.yaml`` (the harness never launches these)."""
    return ((spec == 2) & (quant == 2)) | ((quant == 2) & (tp == 8))


def score(
    tp: Any,
    quant: Any,
    kv8: Any,
    util: Any,
    seqs: Any,
    chunk: Any,
    spec: Any,
    k: Any,
    capture: Any,
    flashinfer: Any,
) -> dict[str, Any]:
    """Vectorised model; ``chunk`` 0 = no chunked prefill, ``capture`` 0 = eager, ``k`` 0
    without speculation; ``quant`` and ``spec`` index QUANT and SPEC."""
    tp, util, seqs, chunk, k, capture = (
        np.asarray(x, dtype=float) for x in (tp, util, seqs, chunk, k, capture)
    )
    quant, spec = np.asarray(quant, dtype=int), np.asarray(spec, dtype=int)
    kv8, flashinfer = np.asarray(kv8, dtype=bool), np.asarray(flashinfer, dtype=bool)
    replicas = GPUS / tp
    clients = CLIENTS / replicas
    weights = PARAMS * np.take(BYTES_PER_PARAM, quant)
    draft = np.where(spec == 2, 1.5e9, 0.0)
    act_tokens = np.where(chunk > 0, chunk, 8192.0)
    activations = act_tokens * HIDDEN * 2.0 * 12.0 / tp
    outside = 1.5e9 + np.where(tp > 1, 0.5e9, 0.0)
    outside = outside + np.where(capture > 0, capture * 4e6 * (1.0 + 0.5 * k), 0.0)
    pool = util * GPU_BYTES - (weights + draft) / tp - activations
    oom = (pool <= 0) | ((1.0 - util) * GPU_BYTES < outside)
    kv_token = KV_BYTES_PER_TOKEN * np.where(kv8, 0.5, 1.0)
    kv_tokens = np.maximum(pool, 0.0) * tp / kv_token
    rejected = ~oom & (kv_tokens < MAX_MODEL_LEN)
    capacity = np.floor(kv_tokens / (INPUT + OUTPUT))
    batch = np.maximum(
        np.minimum.reduce([np.broadcast_to(clients, capacity.shape), seqs, capacity]), 1.0
    )
    verified = batch * (1.0 + k)
    compute_rate = PEAK_BF16 * 0.5 * np.take(COMPUTE_SCALE, quant)
    t_weights = (weights + draft) / tp / HBM
    t_kv = batch * (INPUT + OUTPUT / 2) * kv_token / tp / HBM * np.where(flashinfer, 0.85, 1.0)
    t_compute = 2.0 * PARAMS * verified / tp / compute_rate
    memory = t_weights + t_kv
    step = np.maximum(memory, t_compute) + 0.3 * np.minimum(memory, t_compute)
    ar = np.select([tp == 1, tp == 2, tp == 4], [0.0, 8e-6, 11e-6], 16e-6)
    step = step + 2.0 * LAYERS * ar
    step = step + np.where((capture > 0) & (verified <= capture), 0.4e-3, 3e-3)
    accept = np.take(ACCEPT, spec)
    tokens = np.ones_like(step)
    run = np.ones_like(step)
    for i in range(1, 6):
        run = run * np.where(k >= i, accept * 0.9 ** (i - 1), 0.0)
        tokens = tokens + run
    step = step + np.where(spec == 2, k * (0.06 * t_weights + 0.25e-3), 0.0)
    step = step + np.where(spec == 1, k * 0.05e-3, 0.0)
    prefill = 2.0 * PARAMS * INPUT / tp / (compute_rate * 1.4)
    chunk_eff = np.maximum(chunk, 1.0) / (np.maximum(chunk, 1.0) + 768.0)
    prefill = np.where(chunk > 0, prefill / chunk_eff * 0.6, prefill / 0.95)
    step = step + batch * tokens / OUTPUT * prefill
    per_replica = batch * tokens / step
    return {
        "throughput": replicas * per_replica,
        "tpot_s": step / tokens,
        "cuda_oom": oom,
        "config_rejected": rejected,
        "wrong_output": kv8 & ~flashinfer,
        "kv_tokens": kv_tokens,
    }


def _args(config: Mapping[str, Any]) -> tuple[Any, ...]:
    spec = SPEC.index(str(config["speculative"]))
    return (
        int(config["tensor_parallel_size"]),
        QUANT.index(str(config["quantization"])),
        config["kv_cache_dtype"] == "fp8",
        float(config["gpu_memory_utilization"]),
        int(config["max_num_seqs"]),
        int(config["max_num_batched_tokens"]) if config["enable_chunked_prefill"] else 0,
        spec,
        int(config["num_speculative_tokens"]) if spec else 0,
        int(config["cudagraph_capture_size"]) if config["cuda_graphs"] else 0,
        config["attention_backend"] == "flashinfer",
    )


def evaluate(config: Mapping[str, Any]) -> Result:
    """Launch one configuration (a space TrialConfig)."""
    out = score(*_args(config))
    if bool(out["cuda_oom"]):
        return Result(failure="cuda_oom", reason="torch.OutOfMemoryError: CUDA out of memory")
    if bool(out["config_rejected"]):
        return Result(
            failure="config_rejected",
            reason=f"ValueError: the KV cache holds {float(out['kv_tokens']):.0f} tokens, "
            f"fewer than max_model_len {MAX_MODEL_LEN}",
        )
    if bool(out["wrong_output"]):
        return Result(failure="wrong_output", reason="greedy output differs from the reference")
    return Result(value=float(out["throughput"]), latency_ms=1000.0 * float(out["tpot_s"]))


NAMES = ("tp", "quant", "kv8", "util", "seqs", "chunk", "spec", "k", "capture", "flashinfer")


def _grid() -> dict[str, np.ndarray]:
    specs = [(0, 0), *[(s, k) for s in (1, 2) for k in SPEC_TOKENS]]
    rows = itertools.product(
        TP,
        range(3),
        (0, 1),
        UTIL,
        SEQS,
        (0, *CHUNKS),
        specs,
        (0, *CAPTURE),
        (0, 1),
    )
    arr = np.array(
        [(a, b, c, d, e, f, s[0], s[1], g, h) for a, b, c, d, e, f, s, g, h in rows], dtype=float
    )
    return {n: arr[:, i] for i, n in enumerate(NAMES)}


def _config(g: Mapping[str, np.ndarray], i: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "tensor_parallel_size": int(g["tp"][i]),
        "quantization": QUANT[int(g["quant"][i])],
        "kv_cache_dtype": "fp8" if g["kv8"][i] else "auto",
        "gpu_memory_utilization": float(g["util"][i]),
        "max_num_seqs": int(g["seqs"][i]),
        "enable_chunked_prefill": bool(g["chunk"][i] > 0),
    }
    if g["chunk"][i] > 0:
        config["max_num_batched_tokens"] = int(g["chunk"][i])
    config["speculative"] = SPEC[int(g["spec"][i])]
    if g["spec"][i] > 0:
        config["num_speculative_tokens"] = int(g["k"][i])
    config["cuda_graphs"] = bool(g["capture"][i] > 0)
    if g["capture"][i] > 0:
        config["cudagraph_capture_size"] = int(g["capture"][i])
    config["attention_backend"] = "flashinfer" if g["flashinfer"][i] else "flash_attn"
    return config


def _outcomes(g: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    out = score(*(g[n] for n in NAMES))
    bad = out["cuda_oom"] | out["config_rejected"] | out["wrong_output"]
    bad |= _forbidden(g["quant"], g["tp"], g["spec"])
    return np.where(bad, -math.inf, out["throughput"]), bad


def true_optimum() -> tuple[float, dict[str, Any]]:
    """Best launchable, correct configuration, by exhaustive enumeration."""
    g = _grid()
    values, _ = _outcomes(g)
    i = int(np.argmax(values))
    return float(values[i]), _config(g, i)
