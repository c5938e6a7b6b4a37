"""Flags and environment of one simulated SGLang server, parsed like SGLang 0.5.23 parses them.

The simulated servers are launched with exactly the command lines and environments a real
SGLang deployment gets, so the parser is built from the manifest generated from the real
0.5.23 parser (``autotune/engines/manifests/sglang-0.5.23.json``, ``ServerArgs.add_cli_args``):
every option with its spellings, ``nargs``, type and choices. argparse's default
``allow_abbrev=True`` is kept, as in SGLang: ``--tp 4`` parses as ``--tp-size 4`` and a
removed flag can be an *ambiguous* prefix (``--cuda-graph-max-bs 8`` exits 2, "ambiguous
option", since 0.5.20 split it into ``-decode``/``-prefill``; DOMAIN.md §2). Unknown flags
and bad values exit 2 with argparse's message. Only what the performance model uses is read
into :class:`SimConfig`; every other option is accepted and ignored.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
"""The release whose parser (manifest) the simulated servers speak."""
MANIFEST = (
    Path(__file__).resolve().parents[1]
    / "engines"
    / "manifests"
    / (f"sglang-{SGLANG_VERSION}.json")
)
"""Read as plain JSON (4 ms), not through ``autotune.engines`` (pydantic: ~90 ms of imports
at every server start)."""


@dataclass(frozen=True)
class SimConfig:
    """Everything that decides what one simulated server does: flags plus environment.

    Field names of flags are SGLang's ``ServerArgs`` dest names. ``None`` means "not given"
    so that :func:`autotune.sim.perf_model.resolve` can show the defaults and silent rewrites
    SGLang would apply.
    """

    model_path: str
    served_model_name: str | None = None
    tp_size: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    moe_runner_backend: str = "auto"
    flashinfer_mxfp4_moe_precision: str = "default"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    mem_fraction_static: float | None = None
    disable_custom_all_reduce: bool = False
    cuda_graph_max_bs_decode: int | None = None
    cuda_graph_bs_decode: tuple[int, ...] | None = None
    cuda_graph_backend_decode: str | None = None
    disable_cuda_graph: bool = False  # deprecated in 0.5.23, still parsed
    disable_decode_cuda_graph: bool = False
    disable_overlap_schedule: bool = False
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    page_size: int | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    triton_attention_num_kv_splits: int = 8  # parsed; DeepSeek-V4 forces dsv4 attention
    dsv4_prefill_backend: str = "auto"  # parsed; sparse prefill is never used on sm_120
    enable_metrics: bool = False
    disable_radix_cache: bool = False
    enable_cache_report: bool = False  # usage.prompt_tokens_details.cached_tokens
    attention_backend: str | None = None
    trust_remote_code: bool = False
    base_gpu_id: int = 0
    log_level: str = "info"
    context_length: int | None = None
    random_seed: int | None = None
    # --- environment ---
    nccl_proto: str | None = None
    nccl_algo: str | None = None
    nccl_min_nchannels: int | None = None
    nccl_max_nchannels: int | None = None
    pcie_ipc_allreduce: bool = False  # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE
    pcie_ipc_max_numel: int = 0  # SGLANG_PCIE_IPC_MAX_NUMEL (0: sized from the decode config)
    sm120_flashmla_backend: str = "flashinfer"  # SGLANG_SM120_FLASHMLA_BACKEND
    sm120_direct_swa_kv: bool = False  # SGLANG_OPT_SM120_DIRECT_SWA_KV
    pytorch_cuda_alloc_conf: str | None = None
    static_kv_splits: bool = False  # SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS (no effect)
    cuda_visible_devices: str | None = None
    # --- sim-only environment ---
    sim_load_seconds: float = 0.3
    sim_noise: float = 0.03
    sim_seed: int | None = None
    sim_time_scale: float = 1.0  # stress tests only: every simulated duration x this
    sim_kv_scale: float = 1.0  # stress tests only: KV capacity x this
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        # The perf model memoises on configs: hash once, not 60 fields on every lookup.
        key = tuple(getattr(self, f.name) for f in fields(self) if f.name != "_hash")
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash


# ----------------------------------------------------------------------------------------
# The parser, from the manifest of the real one
# ----------------------------------------------------------------------------------------
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _human_readable_int(value: str) -> int:
    """SGLang's ``human_readable_int`` (``srt/utils/common.py``): 1k, 25.6k, 1Mi, or an int."""
    text = value.strip()
    match = _HUMAN_INT.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * _IEC[suffix]
        return int(float(number) * _SI[suffix])
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {value!r}") from None


def _cuda_graph_backend(value: str) -> str:
    """``parse_cuda_graph_backend_arg`` (``srt/model_executor/cuda_graph_config.py``)."""
    if value == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return value


_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "human_readable_int": _human_readable_int,
    "parse_cuda_graph_backend_arg": _cuda_graph_backend,
}
"""Value types the model reads; the rest (JSON strings, lists) are kept as text."""


def _choices(raw: Sequence[object] | None, convert: Callable[[str], Any]) -> list[Any] | None:
    if raw is None:
        return None
    out = []
    for choice in raw:
        try:
            out.append(convert(str(choice)))
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            out.append(choice)
    return out


def _help(text: str) -> str:
    return text.replace("%", "%%")


@functools.lru_cache(maxsize=1)
def build_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's ``launch_server`` parser, rebuilt from its manifest (once per process)."""
    options = json.loads(MANIFEST.read_text())["options"]
    p = argparse.ArgumentParser(
        prog="python -m sglang.launch_server",
        description=f"Simulated SGLang {SGLANG_VERSION} server (DeepSeek-V4-Flash on RTX PRO "
        "6000, PCIe): every option of the real parser, only some of them modelled.",
    )
    for opt in options:
        flags = list(opt["flags"])
        kw: dict[str, Any] = {"dest": opt["dest"], "help": _help(opt.get("help") or "")}
        if opt.get("required"):
            kw["required"] = True
        if opt["action"] == "boolean_optional":
            p.add_argument(
                flags[0], action=argparse.BooleanOptionalAction, default=opt.get("default"), **kw
            )
            continue
        if not opt["takes_value"]:
            p.add_argument(*flags, action="store_true", default=bool(opt.get("default")), **kw)
            continue
        convert = _TYPES.get(opt.get("type") or "str", str)
        kw["type"] = convert
        kw["default"] = opt.get("default")
        if opt.get("nargs") is not None:
            kw["nargs"] = opt["nargs"]
        choices = _choices(opt.get("choices"), convert)
        if choices is not None:
            kw["choices"] = choices
        p.add_argument(*flags, **kw)
    return p


def _bool_env(value: str | None) -> bool:
    """SGLang's ``EnvBool`` (``srt/environ.py``): 1/true/yes/on, case-insensitive."""
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        # NCCL ignores unparsable integers and keeps its default; so do we.
        return None


def _float_env(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        return default


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> SimConfig:
    """Parse SGLang flags and the environment into a :class:`SimConfig`.

    Unknown, ambiguous or malformed flags make argparse print its usage message and raise
    ``SystemExit(2)``, as SGLang does.
    """
    ns = build_parser().parse_args(list(argv))
    seed_raw = env.get("AUTOTUNE_SIM_SEED")
    try:
        sim_seed = int(seed_raw) if seed_raw not in (None, "") else None
    except ValueError:
        sim_seed = None
    bs = ns.cuda_graph_bs_decode
    return SimConfig(
        model_path=ns.model_path,
        served_model_name=ns.served_model_name,
        tp_size=ns.tp_size,
        host=ns.host,
        port=ns.port,
        disaggregation_mode=ns.disaggregation_mode,
        disaggregation_bootstrap_port=ns.disaggregation_bootstrap_port,
        disaggregation_transfer_backend=ns.disaggregation_transfer_backend,
        moe_runner_backend=ns.moe_runner_backend,
        flashinfer_mxfp4_moe_precision=ns.flashinfer_mxfp4_moe_precision,
        quantization=ns.quantization,
        kv_cache_dtype=ns.kv_cache_dtype,
        mem_fraction_static=ns.mem_fraction_static,
        disable_custom_all_reduce=ns.disable_custom_all_reduce,
        cuda_graph_max_bs_decode=ns.cuda_graph_max_bs_decode,
        cuda_graph_bs_decode=tuple(bs) if bs is not None else None,
        cuda_graph_backend_decode=ns.cuda_graph_backend_decode,
        disable_cuda_graph=ns.disable_cuda_graph,
        disable_decode_cuda_graph=ns.disable_decode_cuda_graph,
        disable_overlap_schedule=ns.disable_overlap_schedule,
        max_running_requests=ns.max_running_requests,
        chunked_prefill_size=ns.chunked_prefill_size,
        page_size=ns.page_size,
        speculative_algorithm=ns.speculative_algorithm,
        speculative_num_steps=ns.speculative_num_steps,
        speculative_eagle_topk=ns.speculative_eagle_topk,
        speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
        triton_attention_num_kv_splits=ns.triton_attention_num_kv_splits,
        dsv4_prefill_backend=ns.dsv4_prefill_backend,
        enable_metrics=ns.enable_metrics,
        disable_radix_cache=ns.disable_radix_cache,
        enable_cache_report=ns.enable_cache_report,
        attention_backend=ns.attention_backend,
        trust_remote_code=ns.trust_remote_code,
        base_gpu_id=ns.base_gpu_id,
        log_level=ns.log_level,
        context_length=ns.context_length,
        random_seed=ns.random_seed,
        nccl_proto=env.get("NCCL_PROTO") or None,
        nccl_algo=env.get("NCCL_ALGO") or None,
        nccl_min_nchannels=_int_env(env, "NCCL_MIN_NCHANNELS"),
        nccl_max_nchannels=_int_env(env, "NCCL_MAX_NCHANNELS"),
        pcie_ipc_allreduce=_bool_env(env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")),
        pcie_ipc_max_numel=max(0, _int_env(env, "SGLANG_PCIE_IPC_MAX_NUMEL") or 0),
        sm120_flashmla_backend=(env.get("SGLANG_SM120_FLASHMLA_BACKEND") or "flashinfer").strip(),
        sm120_direct_swa_kv=_bool_env(env.get("SGLANG_OPT_SM120_DIRECT_SWA_KV")),
        pytorch_cuda_alloc_conf=env.get("PYTORCH_CUDA_ALLOC_CONF") or None,
        static_kv_splits=_bool_env(env.get("SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS")),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        sim_load_seconds=max(0.0, _float_env(env, "AUTOTUNE_SIM_LOAD_SECONDS", 0.3)),
        sim_noise=max(0.0, _float_env(env, "AUTOTUNE_SIM_NOISE", 0.03)),
        sim_seed=sim_seed,
        # AUTOTUNE_SIM_SPEEDUP=8 runs the whole simulation 8x faster than the modeled hardware.
        sim_time_scale=max(
            1e-6,
            _float_env(env, "AUTOTUNE_SIM_TIME_SCALE", 1.0)
            / max(1e-6, _float_env(env, "AUTOTUNE_SIM_SPEEDUP", 1.0)),
        ),
        sim_kv_scale=max(1e-6, _float_env(env, "AUTOTUNE_SIM_KV_SCALE", 1.0)),
    )
