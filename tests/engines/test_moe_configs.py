"""scripts/h200/moe_configs.py lays out the fused-MoE tile tables under the names vLLM 0.26.0
itself reads on the GPU at hand: its own ``get_config_file_name`` names them, from the
device name its platform reports.

The GPU is the one thing not here: the real vLLM 0.26.0 (the GPU wheel over a CPU environment,
as for the manifest) runs the script with its platform's ``get_device_name`` answering what
an H100 SXM's or an H200's driver says. On the H100 of 2026-12-05 the script printed the
same names (BENCHMARKS.md, "The MoE side-by-side on an H100").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "h200" / "moe_configs.py"

# Runs the script as __main__ once per case of the JSON list argv[2] ([device, root]; device ""
# for no GPU, the first case, before any patch) with vLLM's platform reporting the device, and
# prints how each run exited (a JSON list: its exit code, or its message). One process for all:
# importing vLLM 0.26.0 costs ~9 CPU-s, most of this module's time. vLLM reads the device name
# once per process (platform_utils.get_device_name_as_file_name is a functools.cache: a process
# has one GPU), so each case starts with that cache cleared, as a new process would.
RUNNER = """
import json, runpy, sys
script, cases = sys.argv[1], json.loads(sys.argv[2])
from vllm.platforms import current_platform
from vllm.utils.platform_utils import get_device_name_as_file_name
exits = []
for device, root in cases:
    get_device_name_as_file_name.cache_clear()
    if device:
        type(current_platform).get_device_name = classmethod(lambda cls, device_id=0, d=device: d)
    sys.argv = [script, "--root", root]
    try:
        runpy.run_path(script, run_name="__main__")
        exits.append("returned without exiting")
    except SystemExit as exit:
        exits.append(exit.code)
print(json.dumps(exits))
"""
NO_GPU = ""
DEVICES = {  # the name a card's driver reports -> the one vLLM files its tables under
    "NVIDIA H100 80GB HBM3": "NVIDIA_H100_80GB_HBM3",
    "NVIDIA H200": "NVIDIA_H200",
    "NVIDIA H200 NVL": "NVIDIA_H200",  # vLLM files every H200 under one name
}
Runs = dict[str, tuple[Any, Path]]
"""Each device named (NO_GPU: none) -> how the script exited, and the root it wrote into."""


@pytest.fixture(scope="module")
def runs(engine_envs: Any, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Each device's (exit, root): the script run under the real vLLM 0.26.0, a root each."""
    python = Path(engine_envs.ensure("vllm", "0.26.0"))
    cases = [(device, tmp_path_factory.mktemp("moe")) for device in (NO_GPU, *DEVICES)]
    done = subprocess.run(
        [str(python), "-W", "ignore", "-c", RUNNER, str(SCRIPT),
         json.dumps([[device, str(root)] for device, root in cases])],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    exits = json.loads(done.stdout.splitlines()[-1])
    return {device: (code, root) for (device, root), code in zip(cases, exits, strict=True)}


@pytest.mark.parametrize("device", DEVICES)
def test_the_tables_are_named_as_vllm_reads_them_on_the_card(runs: Runs, device: str) -> None:
    code, root = runs[device]
    assert code == 0, code
    name = DEVICES[device]
    expected = {
        f"E=32,N=1408,device_name={name}.json",
        f"E=32,N=1408,device_name={name},dtype=fp8_w8a8.json",
    }
    variants = sorted(p.name for p in root.iterdir())
    assert variants == ["b200-e32-n1408", "h100-e32-n1792"]
    for variant in variants:
        assert {p.name for p in (root / variant).iterdir()} == expected
        tables = [json.loads(p.read_text()) for p in (root / variant).iterdir()]
        assert tables[0] == tables[1]  # one shipped table under both names
        batches = {k: v for k, v in tables[0].items() if k.isdigit()}  # batch size -> tiles
        assert batches and all("BLOCK_SIZE_M" in tiles for tiles in batches.values())


def test_without_a_gpu_it_says_so(runs: Runs) -> None:
    code, root = runs[NO_GPU]
    assert "no CUDA GPU here" in str(code)
    assert list(root.iterdir()) == []
