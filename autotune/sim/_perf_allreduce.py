"""The all-reduce over PCIe: which path one all-reduce takes (none at TP1, PCIe IPC, the TP2
custom all-reduce, NCCL), NCCL's protocol, channel and algorithm choice from the ``NCCL_*``
environment, the resulting latency, and the wrong text that LL128 forced over PCIe produces.

Part of :mod:`autotune.sim.perf_model` (docs/performance-model.md §4.3). Kept together so that
the ``NCCL_*`` environment is read in one place: the step times call
:func:`allreduce_seconds`, the servers :func:`serves_wrong_text`.
"""

from __future__ import annotations

from functools import lru_cache

from autotune.sim._perf_platform import (
    CUSTOM_AR_MAX_BYTES,
    HIDDEN,
    NCCL_DEFAULT_CHANNELS,
    NCCL_LL_MAX_BYTES,
    PCIE_ALGBW_MAX,
)
from autotune.sim._perf_resolution import _resolve
from autotune.sim.args import SimConfig

# ----------------------------------------------------------------------------------------
# All-reduce over PCIe: base latency + bytes / algbw (NCCL default 2 channels, Ring)
# ----------------------------------------------------------------------------------------
NCCL_PROTOCOLS: dict[str, tuple[float, float, float]] = {
    # name: (base latency s, algbw bytes/s at 2 channels, usable share of link bandwidth)
    "Simple": (55e-6, 12e9, 1.0),  # [estimate] latency-bound at 128 KB: ~66 us (§7)
    "LL": (15e-6, 5e9, 0.5),  # [§7, estimate] between Simple and custom; flags halve bw
    "LL128": (2e-6, 16e9, 0.94),  # [§4, estimate] fastest of all, unsafe without NVLink
}
NCCL_TREE_FACTORS = (0.8, 0.6)  # [estimate] base, bw: fewer hops, half-duplex chain on PCIe
NCCL_PER_CHANNEL_SECONDS = 0.5e-6  # [estimate] sync latency per channel above the default
NCCL_CONTENTION_CHANNELS = 8  # [estimate] above this, channels contend for the same links
# [pcie_ipc_ar.py, §7] FlashInfer PCIe IPC all-reduce: 5-39x faster than NCCL at decode sizes
IPC_ALLREDUCE = (6e-6, 12e9)


def allreduce_path(cfg: SimConfig, nbytes: float = HIDDEN * 2) -> str:
    """``none`` (TP1), ``pcie_ipc``, ``custom`` (TP2 custom all-reduce) or ``nccl`` for one
    all-reduce of ``nbytes`` (default: one decode token)."""
    if cfg.tp_size <= 1:
        return "none"
    r = _resolve(cfg)
    if nbytes <= r.ipc_max_bytes:
        return "pcie_ipc"
    # custom_all_reduce.py should_custom_ar: world size 2, or full NVLink (absent here)
    if cfg.tp_size == 2 and not cfg.disable_custom_all_reduce and nbytes <= CUSTOM_AR_MAX_BYTES:
        return "custom"
    return "nccl"


def _nccl_protocol(cfg: SimConfig, nbytes: float) -> str:
    raw = (cfg.nccl_proto or "").replace(" ", "")
    default = ["LL", "Simple"]  # LL128 is off by default without NVLink (§4)
    if not raw:
        allowed = default
    elif raw.startswith("^"):
        excluded = {p.lower() for p in raw[1:].split(",")}
        allowed = [p for p in default if p.lower() not in excluded] or default
    else:
        names = {p.lower() for p in raw.split(",")}
        allowed = [p for p in ("LL", "LL128", "Simple") if p.lower() in names] or default
    if "LL128" in allowed:
        return "LL128"  # NCCL's cost model rates LL128 best at these sizes
    if "LL" in allowed and ("Simple" not in allowed or nbytes <= NCCL_LL_MAX_BYTES):
        return "LL"
    return "Simple"


def _nccl_channels(cfg: SimConfig) -> int:
    ch = NCCL_DEFAULT_CHANNELS
    if cfg.nccl_max_nchannels is not None and cfg.nccl_max_nchannels > 0:
        ch = min(ch, cfg.nccl_max_nchannels)
    if cfg.nccl_min_nchannels is not None and cfg.nccl_min_nchannels > 0:
        ch = max(ch, cfg.nccl_min_nchannels)
    return max(1, min(ch, 64))


def _nccl_tree(cfg: SimConfig) -> bool:
    raw = (cfg.nccl_algo or "").replace(" ", "").lower()
    if raw.startswith("^"):
        return "ring" in raw[1:].split(",") and "tree" not in raw[1:].split(",")
    return raw.split(",")[0] == "tree" if raw else False


@lru_cache(maxsize=4096)
def _nccl_params(cfg: SimConfig) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """(traffic scale, (base, bw) at or below NCCL's LL threshold, (base, bw) above)."""
    scale = 2.0 * (cfg.tp_size - 1) / cfg.tp_size / 1.5  # ring traffic relative to TP4
    ch = _nccl_channels(cfg)
    tree = _nccl_tree(cfg)

    def params(nbytes: float) -> tuple[float, float]:
        base, bw2, share = NCCL_PROTOCOLS[_nccl_protocol(cfg, nbytes)]
        bw = min(bw2 * ch / NCCL_DEFAULT_CHANNELS, PCIE_ALGBW_MAX * share)
        base += NCCL_PER_CHANNEL_SECONDS * max(0, ch - NCCL_DEFAULT_CHANNELS)
        if ch > NCCL_CONTENTION_CHANNELS:
            bw *= NCCL_CONTENTION_CHANNELS / ch
        if tree:
            base *= NCCL_TREE_FACTORS[0]
            bw *= NCCL_TREE_FACTORS[1]
        return base, bw

    return scale, params(NCCL_LL_MAX_BYTES), params(NCCL_LL_MAX_BYTES + 1)


def allreduce_seconds(cfg: SimConfig, nbytes: float) -> float:
    """Latency of one all-reduce of ``nbytes`` across the TP group: base + bytes / algbw."""
    path = allreduce_path(cfg, nbytes)
    if path == "none":
        return 0.0
    scale = 2.0 * (cfg.tp_size - 1) / cfg.tp_size / 1.5
    if path in ("pcie_ipc", "custom"):
        base, bw = IPC_ALLREDUCE
        return base + nbytes * scale / bw
    scale, small, large = _nccl_params(cfg)
    base, bw = small if nbytes <= NCCL_LL_MAX_BYTES else large
    return base + nbytes * scale / bw


def serves_wrong_text(cfg: SimConfig) -> bool:
    """LL128 forced over PCIe while the decode-size all-reduce goes through NCCL corrupts
    activations (§4)."""
    if allreduce_path(cfg) != "nccl":
        return False
    raw = (cfg.nccl_proto or "").replace(" ", "")
    if raw.startswith("^"):
        return False
    return "ll128" in {p.lower() for p in raw.split(",")}
