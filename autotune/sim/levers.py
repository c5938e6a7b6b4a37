"""The lever table of the shared contract, mapped straight onto a :class:`SimConfig`.

``config_from_levers`` skips the command line for fast pure benchmarks; ``levers_to_command``
renders the same levers to flags and environment exactly as the contract says, so that
``parse_config(*levers_to_command(levers)) == config_from_levers(levers)`` (tested).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from autotune.errors import ConfigError
from autotune.sim.args import SimConfig, parse_config

MODEL_MXFP4 = "/models/DeepSeek-V4-Flash"
MODEL_NVFP4 = "/models/DeepSeek-V4-Flash-NVFP4"
SERVED_NAME = "deepseek-ai/DeepSeek-V4-Flash"

CATEGORIES: dict[str, tuple[object, ...]] = {
    "nccl_proto": ("unset", "LL", "LL128", "Simple"),
    "nccl_algo": ("unset", "Ring", "Tree"),
    "nccl_channels": (False, True),
    "custom_all_reduce": (False, True),
    "pcie_ipc_allreduce": (False, True),
    "moe_runner_backend": ("marlin", "triton", "cutlass", "flashinfer_mxfp4", "flashinfer_cutlass"),
    "checkpoint": ("mxfp4", "nvfp4"),
    "speculative": ("off", "eagle"),
    "cuda_graph": (False, True),
    "pytorch_alloc_conf": ("unset", "expandable_segments:True"),
    "triton_attention_num_kv_splits": (1, 2, 4, 8, 16, 32, 64),
    "static_kv_splits": (False, True),
}
INT_RANGES: dict[str, tuple[int, int, int]] = {  # low, high, step
    "speculative_num_steps": (1, 4, 1),
    "cuda_graph_max_bs": (8, 256, 8),
    "max_running_requests": (8, 128, 8),
    "chunked_prefill_size": (1024, 16384, 1024),
}
LOG_INT_RANGES: dict[str, tuple[int, int]] = {
    "nccl_min_nchannels": (1, 32),
    "nccl_max_nchannels": (1, 32),
}
MEM_FRACTIONS = tuple(round(0.70 + 0.01 * i, 2) for i in range(26))
DERIVED = ("speculative_num_draft_tokens",)
LEVER_NAMES = (
    *CATEGORIES,
    *INT_RANGES,
    *LOG_INT_RANGES,
    "mem_fraction_static",
    *DERIVED,
)

BASELINE: dict[str, object] = {
    "nccl_proto": "unset",
    "nccl_algo": "unset",
    "nccl_channels": False,
    "custom_all_reduce": True,
    "pcie_ipc_allreduce": False,
    "moe_runner_backend": "marlin",
    "checkpoint": "mxfp4",
    "speculative": "eagle",
    "speculative_num_steps": 3,
    "speculative_num_draft_tokens": 4,
    "mem_fraction_static": 0.88,
    "cuda_graph": True,
    "cuda_graph_max_bs": 8,
    "max_running_requests": 48,
    "chunked_prefill_size": 8192,
    "pytorch_alloc_conf": "unset",
    "triton_attention_num_kv_splits": 8,
    "static_kv_splits": False,
}


def active_levers(levers: Mapping[str, object]) -> dict[str, object]:
    """Baseline values for missing levers, conditional levers dropped when inactive."""
    unknown = set(levers) - set(LEVER_NAMES)
    if unknown:
        raise ConfigError(
            f"unknown lever(s) {sorted(unknown)}", field="levers", allowed=LEVER_NAMES
        )
    out = {**BASELINE, **levers}
    if out.get("nccl_channels") and not {"nccl_min_nchannels", "nccl_max_nchannels"} <= set(out):
        raise ConfigError(
            "nccl_channels is true but nccl_min_nchannels/nccl_max_nchannels are missing",
            field="nccl_channels",
        )
    if not out.get("nccl_channels"):
        out.pop("nccl_min_nchannels", None)
        out.pop("nccl_max_nchannels", None)
    if out.get("speculative") != "eagle":
        out.pop("speculative_num_steps", None)
        out.pop("speculative_num_draft_tokens", None)
    else:
        out["speculative_num_draft_tokens"] = int(out["speculative_num_steps"]) + 1  # type: ignore[call-overload]
    if not out.get("cuda_graph"):
        out.pop("cuda_graph_max_bs", None)
    return out


def violations(levers: Mapping[str, object]) -> list[str]:
    """Forbidden combinations of the contract that apply."""
    lv = active_levers(levers)
    out = []
    if lv["moe_runner_backend"] == "flashinfer_cutlass" and lv["checkpoint"] != "nvfp4":
        out.append("flashinfer_cutlass needs checkpoint nvfp4")
    if lv["moe_runner_backend"] == "flashinfer_mxfp4" and lv["checkpoint"] != "mxfp4":
        out.append("flashinfer_mxfp4 needs checkpoint mxfp4")
    lo, hi = lv.get("nccl_min_nchannels"), lv.get("nccl_max_nchannels")
    if lo is not None and hi is not None and int(lo) > int(hi):  # type: ignore[call-overload]
        out.append("nccl_min_nchannels > nccl_max_nchannels")
    return out


def base_command(mode: str, *, port: int = 30000) -> tuple[list[str], dict[str, str]]:
    """The deployment's command for one service before levers (common.md)."""
    argv = [
        "--model-path",
        MODEL_MXFP4,
        "--served-model-name",
        SERVED_NAME,
        "--tp-size",
        "4",
        "--disaggregation-mode",
        mode,
        "--disaggregation-bootstrap-port",
        "8998",
        "--disaggregation-transfer-backend",
        "nixl",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-metrics",
        "--trust-remote-code",
    ]
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7" if mode == "decode" else "0,1,2,3"}
    return argv, env


def _set_flag(argv: list[str], flag: str, value: str | None) -> None:
    if flag in argv:
        i = argv.index(flag)
        if value is None:
            return
        argv[i + 1] = value
        return
    argv.append(flag)
    if value is not None:
        argv.append(value)


def levers_to_command(
    levers: Mapping[str, object], *, mode: str = "null", port: int = 30000
) -> tuple[list[str], dict[str, str]]:
    """Flags and environment the contract renders for one service of ``mode``.

    Decode-only levers apply to ``decode`` and ``null``; prefill-only to ``prefill`` and
    ``null``.
    """
    lv = active_levers(levers)
    argv, env = base_command(mode, port=port)
    decode = mode in ("decode", "null")
    prefill = mode in ("prefill", "null")
    if lv["nccl_proto"] != "unset":
        env["NCCL_PROTO"] = str(lv["nccl_proto"])
    if lv["nccl_algo"] != "unset":
        env["NCCL_ALGO"] = str(lv["nccl_algo"])
    if lv.get("nccl_channels"):
        env["NCCL_MIN_NCHANNELS"] = str(int(lv["nccl_min_nchannels"]))  # type: ignore[call-overload]
        env["NCCL_MAX_NCHANNELS"] = str(int(lv["nccl_max_nchannels"]))  # type: ignore[call-overload]
    if not lv["custom_all_reduce"]:
        _set_flag(argv, "--disable-custom-all-reduce", None)
    env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] = "1" if lv["pcie_ipc_allreduce"] else "0"
    _set_flag(argv, "--moe-runner-backend", str(lv["moe_runner_backend"]))
    if lv["checkpoint"] == "nvfp4":
        _set_flag(argv, "--model-path", MODEL_NVFP4)
        _set_flag(argv, "--quantization", "modelopt_fp4")
    else:
        _set_flag(argv, "--model-path", MODEL_MXFP4)
        _set_flag(argv, "--quantization", "mxfp4")
    _set_flag(argv, "--mem-fraction-static", repr(float(lv["mem_fraction_static"])))  # type: ignore[arg-type]
    if lv["pytorch_alloc_conf"] != "unset":
        env["PYTORCH_CUDA_ALLOC_CONF"] = str(lv["pytorch_alloc_conf"])
    if decode:
        if lv["speculative"] == "eagle":
            _set_flag(argv, "--speculative-algorithm", "EAGLE")
            _set_flag(argv, "--speculative-eagle-topk", "1")
            _set_flag(argv, "--disable-radix-cache", None)
            _set_flag(argv, "--speculative-num-steps", str(int(lv["speculative_num_steps"])))  # type: ignore[call-overload]
            _set_flag(
                argv,
                "--speculative-num-draft-tokens",
                str(int(lv["speculative_num_draft_tokens"])),  # type: ignore[call-overload]
            )
        if lv["cuda_graph"]:
            _set_flag(argv, "--cuda-graph-max-bs", str(int(lv["cuda_graph_max_bs"])))  # type: ignore[call-overload]
        else:
            _set_flag(argv, "--disable-cuda-graph", None)
        _set_flag(argv, "--max-running-requests", str(int(lv["max_running_requests"])))  # type: ignore[call-overload]
        _set_flag(
            argv,
            "--triton-attention-num-kv-splits",
            str(int(lv["triton_attention_num_kv_splits"])),  # type: ignore[call-overload]
        )
        env["SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS"] = (
            "true" if lv["static_kv_splits"] else "false"
        )
    if prefill:
        _set_flag(argv, "--chunked-prefill-size", str(int(lv["chunked_prefill_size"])))  # type: ignore[call-overload]
    return argv, env


def config_from_levers(
    levers: Mapping[str, object], *, mode: str = "null", port: int = 30000
) -> SimConfig:
    """The :class:`SimConfig` a server of ``mode`` gets from these levers (no parsing)."""
    lv = active_levers(levers)
    decode = mode in ("decode", "null")
    prefill = mode in ("prefill", "null")
    nvfp4 = lv["checkpoint"] == "nvfp4"
    spec = decode and lv["speculative"] == "eagle"
    channels = bool(lv.get("nccl_channels"))
    return SimConfig(
        model_path=MODEL_NVFP4 if nvfp4 else MODEL_MXFP4,
        served_model_name=SERVED_NAME,
        tp_size=4,
        host="127.0.0.1",
        port=port,
        disaggregation_mode=mode,
        disaggregation_bootstrap_port=8998,
        disaggregation_transfer_backend="nixl",
        moe_runner_backend=str(lv["moe_runner_backend"]),
        quantization="modelopt_fp4" if nvfp4 else "mxfp4",
        mem_fraction_static=float(lv["mem_fraction_static"]),  # type: ignore[arg-type]
        disable_custom_all_reduce=not lv["custom_all_reduce"],
        cuda_graph_max_bs=int(lv["cuda_graph_max_bs"])  # type: ignore[call-overload]
        if decode and lv["cuda_graph"]
        else None,
        disable_cuda_graph=decode and not lv["cuda_graph"],
        max_running_requests=int(lv["max_running_requests"]) if decode else None,  # type: ignore[call-overload]
        chunked_prefill_size=int(lv["chunked_prefill_size"]) if prefill else None,  # type: ignore[call-overload]
        speculative_algorithm="EAGLE" if spec else None,
        speculative_num_steps=int(lv["speculative_num_steps"]) if spec else None,  # type: ignore[call-overload]
        speculative_eagle_topk=1 if spec else None,
        speculative_num_draft_tokens=int(lv["speculative_num_draft_tokens"]) if spec else None,  # type: ignore[call-overload]
        triton_attention_num_kv_splits=int(lv["triton_attention_num_kv_splits"]) if decode else 8,  # type: ignore[call-overload]
        enable_metrics=True,
        disable_radix_cache=spec,
        trust_remote_code=True,
        nccl_proto=None if lv["nccl_proto"] == "unset" else str(lv["nccl_proto"]),
        nccl_algo=None if lv["nccl_algo"] == "unset" else str(lv["nccl_algo"]),
        nccl_min_nchannels=int(lv["nccl_min_nchannels"]) if channels else None,  # type: ignore[call-overload]
        nccl_max_nchannels=int(lv["nccl_max_nchannels"]) if channels else None,  # type: ignore[call-overload]
        pcie_ipc_allreduce=bool(lv["pcie_ipc_allreduce"]),
        pytorch_cuda_alloc_conf=None
        if lv["pytorch_alloc_conf"] == "unset"
        else str(lv["pytorch_alloc_conf"]),
        static_kv_splits=decode and bool(lv["static_kv_splits"]),
        cuda_visible_devices="4,5,6,7" if mode == "decode" else "0,1,2,3",
    )


def config_via_command(levers: Mapping[str, object], *, mode: str = "null") -> SimConfig:
    """Same as :func:`config_from_levers`, through the command line (slow path; tests)."""
    argv, env = levers_to_command(levers, mode=mode)
    return parse_config(argv, env)


def _log_int(rng: random.Random, low: int, high: int) -> int:
    v = math.exp(
        rng.uniform(math.log(low - 0.5 + 1e-9 if low > 0.5 else 0.5), math.log(high + 0.5))
    )
    return min(high, max(low, int(round(v))))


def sample_levers(rng: random.Random) -> dict[str, object]:
    """A random valid lever setting (uniform per lever, forbidden combinations rejected)."""
    while True:
        lv: dict[str, object] = {k: rng.choice(v) for k, v in CATEGORIES.items()}
        for name, (lo, hi, step) in INT_RANGES.items():
            lv[name] = rng.randrange(lo, hi + 1, step)
        for name, (lo, hi) in LOG_INT_RANGES.items():
            lv[name] = _log_int(rng, lo, hi)
        lv["mem_fraction_static"] = rng.choice(MEM_FRACTIONS)
        lv = active_levers(lv)
        if not violations(lv):
            return lv


def changed_levers(levers: Mapping[str, object]) -> list[str]:
    """Levers whose active value differs from the baseline (derived ones excluded)."""
    lv = active_levers(levers)
    base = active_levers(BASELINE)
    names = set(lv) | set(base)
    return sorted(n for n in names if n not in DERIVED and lv.get(n) != base.get(n))
