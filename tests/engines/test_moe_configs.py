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

# Runs the script as __main__ with vLLM's platform reporting DEVICE (argv[1], "" for no GPU)
# and prints how it exited: {"exit": its code, or its message}.
RUNNER = """
import json, runpy, sys
script, device, root = sys.argv[1:4]
if device:
    from vllm.platforms import current_platform
    type(current_platform).get_device_name = classmethod(lambda cls, device_id=0: device)
sys.argv = [script, "--root", root]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exit:
    print(json.dumps({"exit": exit.code}))
"""


def _run(python: Path, device: str, root: Path) -> Any:
    """The script's exit code or message, once it ran under ``python`` (its stderr on a crash)."""
    done = subprocess.run(
        [str(python), "-W", "ignore", "-c", RUNNER, str(SCRIPT), device, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])["exit"]


@pytest.fixture(scope="module")
def vllm_python(engine_envs: Any) -> Path:
    return Path(engine_envs.ensure("vllm", "0.26.0"))


@pytest.mark.parametrize(
    ("device", "name"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200"),  # vLLM files every H200 under one name
    ],
)
def test_the_tables_are_named_as_vllm_reads_them_on_the_card(
    vllm_python: Path, tmp_path: Path, device: str, name: str
) -> None:
    assert _run(vllm_python, device, tmp_path) == 0
    expected = {
        f"E=32,N=1408,device_name={name}.json",
        f"E=32,N=1408,device_name={name},dtype=fp8_w8a8.json",
    }
    variants = sorted(p.name for p in tmp_path.iterdir())
    assert variants == ["b200-e32-n1408", "h100-e32-n1792"]
    for variant in variants:
        assert {p.name for p in (tmp_path / variant).iterdir()} == expected
        tables = [json.loads(p.read_text()) for p in (tmp_path / variant).iterdir()]
        assert tables[0] == tables[1]  # one shipped table under both names
        batches = {k: v for k, v in tables[0].items() if k.isdigit()}  # batch size -> tiles
        assert batches and all("BLOCK_SIZE_M" in tiles for tiles in batches.values())


def test_without_a_gpu_it_says_so(vllm_python: Path, tmp_path: Path) -> None:
    assert "no CUDA GPU here" in str(_run(vllm_python, "", tmp_path))
    assert list(tmp_path.iterdir()) == []
