#!/usr/bin/env python3
"""Lay out the fused-MoE tile tables that search_spaces/vllm-h200-moe.yaml offers, on the GPU
machine, from the tables the installed vLLM ships (nothing is copied into this repository).

vLLM reads a Triton fused-MoE table from ``$VLLM_TUNED_CONFIG_FOLDER/<name>`` first, then from
its package's ``model_executor/layers/fused_moe/configs/<name>``, with ``<name>`` =
``E={experts},N={expert MLP},device_name={GPU}[,dtype=fp8_w8a8].json`` ({GPU}: NVIDIA_H200 on
any H200, NVIDIA_H100_80GB_HBM3 on an H100 SXM). 0.26.0 ships none for the MoE model's shape
(E=32, N=1408) on either Hopper card, so it falls back to a heuristic. Each variant below is a
folder holding one shipped table under both of this GPU's names (bf16 and fp8 experts), named
by vLLM's own ``get_config_file_name``; the space's ``moe_triton_config`` points
``VLLM_TUNED_CONFIG_FOLDER`` at one.

    PYTHONPATH=/tmp/site python3 scripts/h200/moe_configs.py [--root /var/tmp/autotune-moe-configs]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

EXPERTS, MLP = 32, 1408
VARIANTS = {
    # the same shape, tuned on a B200
    "b200-e32-n1408": "E=32,N=1408,device_name=NVIDIA_B200.json",
    # the nearest shape tuned on Hopper (an H100: the same SM as the H200)
    "h100-e32-n1792": "E=32,N=1792,device_name=NVIDIA_H100_80GB_HBM3.json",
}
DTYPES = (None, "fp8_w8a8")  # bf16 experts, then fp8 experts


def targets() -> tuple[str, ...]:
    """The names under which the installed vLLM looks for this GPU's tables for E=32, N=1408.

    vLLM's own naming (fused_moe.py get_config_file_name: the CUDA device name with spaces as
    underscores, any H200 as NVIDIA_H200), so a table laid out here is the one it reads on this
    card, whichever Hopper card the machine has.
    """
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name

    try:
        return tuple(get_config_file_name(EXPERTS, MLP, dtype) for dtype in DTYPES)
    except NotImplementedError:  # vLLM's platform has no device name: no GPU here
        raise SystemExit(
            "no CUDA GPU here: the tables are named after the GPU that reads them"
        ) from None


def shipped_configs() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vllm is not importable: install the kit first (scripts/h200/kit.py)")
    return Path(spec.submodule_search_locations[0]) / "model_executor/layers/fused_moe/configs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("/var/tmp/autotune-moe-configs"))
    args = ap.parse_args(argv)
    source = shipped_configs()
    names = targets()
    for variant, name in VARIANTS.items():
        table = source / name
        if not table.is_file():
            raise SystemExit(f"{table} is not in this vLLM: the variant {variant} needs it")
        folder = args.root / variant
        folder.mkdir(parents=True, exist_ok=True)
        for target in names:
            shutil.copyfile(table, folder / target)
        print(f"{folder}: {name} as {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
