"""Which variables of autotune's environment a trial records as a service's inheritance, and
how the exports set them (autotune/trial/inherited_env.py, autotune/export/inherited.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from systemd_verify import SYSTEMD_ANALYZE, verify

from autotune.engines import get_engine
from autotune.export import export
from autotune.results import TrialResult
from autotune.specs import ServiceSpec
from autotune.trial.inherited_env import env_changes, inherited_env, services_changes
from autotune.trial.record import ServiceRecord

ENVIRON = {
    "VLLM_WORKER_MULTIPROC_METHOD": "fork",  # vLLM's prefix and registry
    "VLLM_NOT_A_VARIABLE": "1",  # vLLM's prefix: recorded (a typo is still inherited)
    "SGLANG_ENABLE_TORCH_COMPILE": "1",  # another engine's prefix
    "NCCL_P2P_DISABLE": "1",  # the library under every engine
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "LD_PRELOAD": "/usr/lib/libtcmalloc.so",
    "LOCAL_RANK": "0",  # not prefixed, but in vLLM's registry
    "HF_TOKEN": "hf_planted_secret_value",  # secret: never
    "NCCL_IB_PASSWORD": "x",  # secret-looking name: never
    "AUTOTUNE_FAILPOINTS": "x",  # autotune's own
    "HOME": "/root",
    "PATH": "/usr/bin",
    "CUDA_VISIBLE_DEVICES": "0",  # set by the spec below: the spec's, not inherited
    "OMP_NUM_THREADS": "8",  # unset by the spec below
}


def _spec(**kw: object) -> ServiceSpec:
    base: dict[str, object] = {
        "name": "engine",
        "argv": ("vllm", "serve", "m"),
        "port": 8000,
        "health_url": "http://127.0.0.1:8000/health",
        "log_file": "/tmp/engine.log",
        "env": {"CUDA_VISIBLE_DEVICES": "1"},
        "unset_env": ("OMP_NUM_THREADS",),
    }
    return ServiceSpec.model_validate({**base, **kw})


def test_the_engine_and_library_variables_are_recorded_secrets_and_own_never() -> None:
    got = inherited_env(_spec(), get_engine("vllm", "0.26.0"), environ=ENVIRON)
    assert got == {
        "LD_PRELOAD": "/usr/lib/libtcmalloc.so",
        "LOCAL_RANK": "0",
        "NCCL_P2P_DISABLE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_NOT_A_VARIABLE": "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
    }
    assert list(got) == sorted(got)
    sglang = inherited_env(_spec(), get_engine("sglang", "0.5.23"), environ=ENVIRON)
    assert sglang is not None
    assert "SGLANG_ENABLE_TORCH_COMPILE" in sglang and "VLLM_WORKER_MULTIPROC_METHOD" not in sglang
    # No engine known (a generic command): the libraries' variables only.
    generic = inherited_env(_spec(), None, environ=ENVIRON)
    assert generic is not None and set(generic) == {
        "LD_PRELOAD",
        "NCCL_P2P_DISABLE",
        "PYTORCH_CUDA_ALLOC_CONF",
    }


def test_a_service_on_another_host_records_nothing() -> None:
    engine = get_engine("vllm", "0.26.0")
    assert inherited_env(_spec(on="gpu1", manager="process"), engine, environ=ENVIRON) is None
    assert (
        inherited_env(_spec(manager="systemd", unit="v.service"), engine, environ=ENVIRON) is None
    )


def test_changes_are_said_per_variable_and_service() -> None:
    then = {"VLLM_WORKER_MULTIPROC_METHOD": "fork", "NCCL_P2P_DISABLE": "1"}
    now = {"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}
    assert env_changes(then, now) == [
        "NCCL_ALGO: unset then, Ring now",
        "VLLM_WORKER_MULTIPROC_METHOD: fork then, unset now",
    ]
    assert env_changes(then, dict(then)) == []
    # Unknown on either side (an older trial, a remote service): no judgement.
    assert services_changes({"a": then, "b": None, "c": then}, {"a": now, "b": now}) == [
        "a: NCCL_ALGO: unset then, Ring now",
        "a: VLLM_WORKER_MULTIPROC_METHOD: fork then, unset now",
    ]


def test_a_long_value_is_shown_around_where_it_changed() -> None:
    """A CUDA image's NVIDIA_REQUIRE_CUDA runs to ~2,000 characters: the line shows the part
    that differs, says the length, and stays short."""
    base = "cuda>=13.0 " + " ".join(
        f"brand=tesla,driver>={n},driver<{n + 1}" for n in range(400, 470)
    )
    then = {"NVIDIA_REQUIRE_CUDA": base, "NCCL_ALGO": "Ring"}
    now = {"NVIDIA_REQUIRE_CUDA": base.replace("driver>=435", "driver>=999"), "NCCL_ALGO": "Tree"}
    lines = env_changes(then, now)
    assert lines[0] == "NCCL_ALGO: Ring then, Tree now"  # short values whole
    line = lines[1]
    assert len(line) < 200 < len(base)
    assert "driver>=435" in line and "driver>=999" in line
    assert line.count(f"({len(base):,} chars)") == 2
    assert line.startswith("NVIDIA_REQUIRE_CUDA: ...") and "... (" in line
    # Set or unset: the set side in part, from its start.
    (gone,) = env_changes({"NVIDIA_REQUIRE_CUDA": base}, {})
    assert gone.startswith("NVIDIA_REQUIRE_CUDA: cuda>=13.0 ") and gone.endswith("then, unset now")
    assert len(gone) < 120


def _trial() -> TrialResult:
    engine = ServiceRecord(
        argv=[sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/models/m"],
        env={"CUDA_VISIBLE_DEVICES": "0", "NCCL_P2P_DISABLE": "0"},
        unset_env=["OMP_NUM_THREADS"],
        command="env -u OMP_NUM_THREADS CUDA_VISIBLE_DEVICES=0 NCCL_P2P_DISABLE=0 python -m vllm",
        inherited_env={
            "VLLM_WORKER_MULTIPROC_METHOD": "fork",
            "NCCL_P2P_DISABLE": "1",  # the trial's own value wins
            "OMP_NUM_THREADS": "4",  # the trial unsets it: stays unset
            "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        },
        health_url="http://127.0.0.1:8000/health",
    )
    return TrialResult(
        number=7,
        state="COMPLETE",
        values=[100.0],
        metric_names=["output_throughput_tok_s"],
        services={"engine": engine},
        config={"x": 1},
        feasible=True,
        throughput=100.0,
    )


def test_systemd_and_command_exports_set_what_was_inherited(tmp_path: Path) -> None:
    notes: list[str] = []
    export(_trial(), fmt="systemd", out_dir=tmp_path, notes=notes.append)
    path = next(tmp_path.glob("units/*.service"))
    unit = path.read_text()
    assert 'Environment="VLLM_WORKER_MULTIPROC_METHOD=fork"' in unit
    assert 'Environment="LD_LIBRARY_PATH=/usr/local/cuda/lib64"' in unit  # same machine
    assert 'Environment="NCCL_P2P_DISABLE=0"' in unit and "NCCL_P2P_DISABLE=1" not in unit
    assert "OMP_NUM_THREADS=4" not in unit and "UnsetEnvironment=OMP_NUM_THREADS" in unit
    assert any("VLLM_WORKER_MULTIPROC_METHOD=fork" in n for n in notes), notes
    if SYSTEMD_ANALYZE:
        result = verify(path)
        assert result.returncode == 0, result.stderr
    command = export(_trial(), fmt="command", out_dir=None, notes=None)
    assert isinstance(command, str) and "VLLM_WORKER_MULTIPROC_METHOD=fork" in command


def test_containers_leave_this_machines_paths_out_and_json_keeps_the_record() -> None:
    notes: list[str] = []
    text = export(_trial(), fmt="compose", out_dir=None, notes=notes.append)
    assert isinstance(text, str)
    env = yaml.safe_load(text)["services"]["engine"]["environment"]
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert "LD_LIBRARY_PATH" not in env
    assert any("LD_LIBRARY_PATH" in n and "left out" in n for n in notes), notes
    raw = export(_trial(), fmt="json", out_dir=None, notes=None)
    assert isinstance(raw, str)
    doc = yaml.safe_load(raw)["services"]["engine"]
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in doc["env"]
    assert doc["inherited_env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
