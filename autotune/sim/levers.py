"""The lever table of the shared contract, mapped straight onto a :class:`SimConfig`.

The names are the parameters of ``search_spaces/dsv4-flash-rtx6000-pd.yaml``.
``config_from_levers`` skips the command line for fast pure benchmarks; ``levers_to_command``
renders the same levers to SGLang 0.5.23 flags and environment exactly as the space does, so
that ``parse_config(*levers_to_command(levers)) == config_from_levers(levers)`` (tested).
``pd_configs`` gives the (prefill, decode) pair the PD deployment runs.
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

GRAPH_BS_LISTS: dict[str, tuple[int, ...]] = {
    "pow2-16": (1, 2, 4, 8, 16),
    "pow2-32": (1, 2, 4, 8, 16, 32),
    "all-16": tuple(range(1, 17)),
}
"""``--cuda-graph-bs-decode`` choices (``unset``: SGLang's own list up to the max)."""

CATEGORIES: dict[str, tuple[object, ...]] = {
    "nccl_proto": ("unset", "LL", "LL128", "Simple"),
    "nccl_algo": ("unset", "Ring", "Tree"),
    "nccl_channels": (False, True),
    "pcie_ipc_allreduce": (False, True),
    "moe_runner_backend": (
        "auto",
        "marlin",
        "triton",
        "cutlass",
        "flashinfer_mxfp4",
        "flashinfer_cutlass",
        "flashinfer_cutedsl",
    ),
    "checkpoint": ("mxfp4", "nvfp4"),
    "sm120_flashmla_backend": ("flashinfer", "triton", "torch"),
    "sm120_direct_swa_kv": (False, True),
    "speculative": ("off", "eagle"),
    "prefill_speculative": (False, True),
    "cuda_graph_backend_decode": ("full", "breakable", "disabled"),
    "cuda_graph_bs_decode": ("unset", *GRAPH_BS_LISTS),
    "disable_overlap_schedule": (False, True),
    "pytorch_alloc_conf": ("unset", "expandable_segments:True"),
}
INT_RANGES: dict[str, tuple[int, int, int]] = {  # low, high, step
    "speculative_num_steps": (1, 4, 1),
    "cuda_graph_max_bs_decode": (8, 256, 8),
    "max_running_requests": (8, 128, 8),
    "chunked_prefill_size": (1024, 16384, 1024),
}
LOG_INT_RANGES: dict[str, tuple[int, int]] = {
    "nccl_min_nchannels": (1, 32),
    "nccl_max_nchannels": (1, 32),
}
MEM_FRACTIONS = tuple(round(0.70 + 0.01 * i, 2) for i in range(26))
DERIVED = (
    "speculative_num_draft_tokens",
    "prefill_speculative_num_steps",
    "prefill_speculative_num_draft_tokens",
)
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
    "pcie_ipc_allreduce": False,
    "moe_runner_backend": "marlin",
    "checkpoint": "mxfp4",
    "sm120_flashmla_backend": "triton",
    "speculative": "eagle",
    "speculative_num_steps": 3,
    "speculative_num_draft_tokens": 4,
    "prefill_speculative": False,
    "mem_fraction_static": 0.88,
    "cuda_graph_backend_decode": "full",
    "cuda_graph_bs_decode": "unset",
    "cuda_graph_max_bs_decode": 8,
    "max_running_requests": 48,
    "disable_overlap_schedule": False,
    "chunked_prefill_size": 8192,
    "pytorch_alloc_conf": "unset",
}
"""The seeds' deployment in 0.5.23 spelling (DOMAIN.md §1): Marlin MoE on the MXFP4
checkpoint, the Triton sparse-MLA decode kernel, 3-step MTP on decode only, graphs up to 8."""


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
    if out.get("sm120_flashmla_backend") == "flashinfer":
        out.setdefault("sm120_direct_swa_kv", False)
    else:
        out.pop("sm120_direct_swa_kv", None)
    if out.get("speculative") != "eagle":
        for name in (
            "speculative_num_steps",
            "speculative_num_draft_tokens",
            "prefill_speculative",
            "prefill_speculative_num_steps",
            "prefill_speculative_num_draft_tokens",
        ):
            out.pop(name, None)
    else:
        steps = int(out["speculative_num_steps"])  # type: ignore[call-overload]
        out["speculative_num_draft_tokens"] = steps + 1
        out.setdefault("prefill_speculative", False)
        if out["prefill_speculative"]:
            out["prefill_speculative_num_steps"] = steps
            out["prefill_speculative_num_draft_tokens"] = steps + 1
        else:
            out.pop("prefill_speculative_num_steps", None)
            out.pop("prefill_speculative_num_draft_tokens", None)
    if out.get("cuda_graph_backend_decode") == "disabled":
        out.pop("cuda_graph_bs_decode", None)
        out.pop("cuda_graph_max_bs_decode", None)
    else:
        out.setdefault("cuda_graph_bs_decode", "unset")
        if out["cuda_graph_bs_decode"] != "unset":
            out.pop("cuda_graph_max_bs_decode", None)
        elif "cuda_graph_max_bs_decode" not in out:
            out["cuda_graph_max_bs_decode"] = BASELINE["cuda_graph_max_bs_decode"]
    return out


def violations(levers: Mapping[str, object]) -> list[str]:
    """Forbidden combinations of the contract that apply (the space's ``forbidden:``)."""
    lv = active_levers(levers)
    out = []
    runner, ckpt = lv["moe_runner_backend"], lv["checkpoint"]
    if runner in ("flashinfer_cutlass", "flashinfer_cutedsl") and ckpt != "nvfp4":
        out.append(f"{runner} needs checkpoint nvfp4")
    if runner == "flashinfer_mxfp4" and ckpt != "mxfp4":
        out.append("flashinfer_mxfp4 needs checkpoint mxfp4")
    if runner == "auto" and ckpt == "nvfp4":
        out.append("auto resolves NVFP4 to flashinfer_trtllm_routed, SM100-only")
    lo, hi = lv.get("nccl_min_nchannels"), lv.get("nccl_max_nchannels")
    if lo is not None and hi is not None and int(lo) > int(hi):  # type: ignore[call-overload]
        out.append("nccl_min_nchannels > nccl_max_nchannels")
    return out


def base_command(mode: str, *, port: int = 30000) -> tuple[list[str], dict[str, str]]:
    """The deployment's command for one service before levers (the bundled launcher)."""
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


def _set_flag(argv: list[str], flag: str, *values: str) -> None:
    """Set ``flag`` to ``values`` (none: a switch), replacing what the base command had."""
    if flag in argv:
        i = argv.index(flag)
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        argv[i + 1 : j] = list(values)
        return
    argv.append(flag)
    argv.extend(values)


def _speculative_flags(argv: list[str], steps: int) -> None:
    _set_flag(argv, "--speculative-algorithm", "EAGLE")
    _set_flag(argv, "--speculative-eagle-topk", "1")
    _set_flag(argv, "--speculative-num-steps", str(steps))
    _set_flag(argv, "--speculative-num-draft-tokens", str(steps + 1))


def levers_to_command(
    levers: Mapping[str, object], *, mode: str = "null", port: int = 30000
) -> tuple[list[str], dict[str, str]]:
    """Flags and environment the space renders for one service of ``mode``.

    Decode-only levers apply to ``decode`` and ``null``; prefill-only to ``prefill`` and
    ``null`` (a null server takes the decode side's speculative settings).
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
    env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] = "1" if lv["pcie_ipc_allreduce"] else "0"
    _set_flag(argv, "--moe-runner-backend", str(lv["moe_runner_backend"]))
    if lv["checkpoint"] == "nvfp4":
        _set_flag(argv, "--model-path", MODEL_NVFP4)
        _set_flag(argv, "--quantization", "modelopt_fp4")
    else:
        _set_flag(argv, "--model-path", MODEL_MXFP4)
        _set_flag(argv, "--quantization", "mxfp4")
    env["SGLANG_SM120_FLASHMLA_BACKEND"] = str(lv["sm120_flashmla_backend"])
    if "sm120_direct_swa_kv" in lv:
        env["SGLANG_OPT_SM120_DIRECT_SWA_KV"] = "1" if lv["sm120_direct_swa_kv"] else "0"
    _set_flag(argv, "--mem-fraction-static", repr(float(lv["mem_fraction_static"])))  # type: ignore[arg-type]
    if lv["pytorch_alloc_conf"] != "unset":
        env["PYTORCH_CUDA_ALLOC_CONF"] = str(lv["pytorch_alloc_conf"])
    if decode:
        if lv["speculative"] == "eagle":
            _speculative_flags(argv, int(lv["speculative_num_steps"]))  # type: ignore[call-overload]
            _set_flag(argv, "--disable-radix-cache")
        _set_flag(argv, "--cuda-graph-backend-decode", str(lv["cuda_graph_backend_decode"]))
        if "cuda_graph_max_bs_decode" in lv:
            _set_flag(argv, "--cuda-graph-max-bs-decode", str(int(lv["cuda_graph_max_bs_decode"])))  # type: ignore[call-overload]
        bs = lv.get("cuda_graph_bs_decode", "unset")
        if bs != "unset":
            _set_flag(argv, "--cuda-graph-bs-decode", *(str(b) for b in GRAPH_BS_LISTS[str(bs)]))
        _set_flag(argv, "--max-running-requests", str(int(lv["max_running_requests"])))  # type: ignore[call-overload]
        if lv["disable_overlap_schedule"]:
            _set_flag(argv, "--disable-overlap-schedule")
    if prefill:
        _set_flag(argv, "--chunked-prefill-size", str(int(lv["chunked_prefill_size"])))  # type: ignore[call-overload]
        if mode == "prefill" and lv.get("prefill_speculative"):
            _speculative_flags(argv, int(lv["prefill_speculative_num_steps"]))  # type: ignore[call-overload]
    return argv, env


def config_from_levers(
    levers: Mapping[str, object], *, mode: str = "null", port: int = 30000
) -> SimConfig:
    """The :class:`SimConfig` a server of ``mode`` gets from these levers (no parsing)."""
    lv = active_levers(levers)
    decode = mode in ("decode", "null")
    prefill = mode in ("prefill", "null")
    nvfp4 = lv["checkpoint"] == "nvfp4"
    spec = (decode and lv["speculative"] == "eagle") or (
        mode == "prefill" and bool(lv.get("prefill_speculative"))
    )
    steps = int(lv["speculative_num_steps"]) if spec else None  # type: ignore[call-overload]
    channels = bool(lv.get("nccl_channels"))
    bs = lv.get("cuda_graph_bs_decode", "unset")
    max_bs = lv.get("cuda_graph_max_bs_decode")
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
        cuda_graph_backend_decode=str(lv["cuda_graph_backend_decode"]) if decode else None,
        cuda_graph_max_bs_decode=int(max_bs) if decode and max_bs is not None else None,  # type: ignore[call-overload]
        cuda_graph_bs_decode=GRAPH_BS_LISTS[str(bs)] if decode and bs != "unset" else None,
        disable_overlap_schedule=decode and bool(lv["disable_overlap_schedule"]),
        max_running_requests=int(lv["max_running_requests"]) if decode else None,  # type: ignore[call-overload]
        chunked_prefill_size=int(lv["chunked_prefill_size"]) if prefill else None,  # type: ignore[call-overload]
        speculative_algorithm="EAGLE" if spec else None,
        speculative_num_steps=steps,
        speculative_eagle_topk=1 if spec else None,
        speculative_num_draft_tokens=steps + 1 if steps is not None else None,
        enable_metrics=True,
        disable_radix_cache=decode and spec,
        trust_remote_code=True,
        nccl_proto=None if lv["nccl_proto"] == "unset" else str(lv["nccl_proto"]),
        nccl_algo=None if lv["nccl_algo"] == "unset" else str(lv["nccl_algo"]),
        nccl_min_nchannels=int(lv["nccl_min_nchannels"]) if channels else None,  # type: ignore[call-overload]
        nccl_max_nchannels=int(lv["nccl_max_nchannels"]) if channels else None,  # type: ignore[call-overload]
        pcie_ipc_allreduce=bool(lv["pcie_ipc_allreduce"]),
        sm120_flashmla_backend=str(lv["sm120_flashmla_backend"]),
        sm120_direct_swa_kv=bool(lv.get("sm120_direct_swa_kv", False)),
        pytorch_cuda_alloc_conf=None
        if lv["pytorch_alloc_conf"] == "unset"
        else str(lv["pytorch_alloc_conf"]),
        cuda_visible_devices="4,5,6,7" if mode == "decode" else "0,1,2,3",
    )


def pd_configs(levers: Mapping[str, object]) -> tuple[SimConfig, SimConfig]:
    """(prefill server, decode server) of the PD deployment: pass them to
    ``perf_model.expectation(decode, prefill=prefill, ...)``."""
    return config_from_levers(levers, mode="prefill"), config_from_levers(levers, mode="decode")


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
