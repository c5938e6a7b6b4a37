"""Shared pieces of the end-to-end tests: running the CLI for real and reading the study."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import optuna

REPO = Path(__file__).resolve().parents[1]
E2E_STUDY = REPO / "tests" / "data" / "e2e-study.yaml"

# A healthy, fast configuration of the bundled space (no OOM, correct output).
FAST_CONFIG: dict[str, object] = {
    "nccl_proto": "LL",
    "nccl_algo": "Ring",
    "nccl_channels": False,
    "pcie_ipc_allreduce": True,
    "moe_runner_backend": "flashinfer_cutlass",
    "checkpoint": "nvfp4",
    "sm120_flashmla_backend": "flashinfer",
    "sm120_direct_swa_kv": True,
    "speculative": "off",
    "mem_fraction_static": 0.8,
    "cuda_graph_backend_decode": "full",
    "cuda_graph_bs_decode": "unset",
    "cuda_graph_max_bs_decode": 32,
    "max_running_requests": 32,
    "disable_overlap_schedule": False,
    "chunked_prefill_size": 4096,
    "pytorch_alloc_conf": "unset",
}


def autotune_cli(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"autotune {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def load(study: str, db: Path) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{db}")


class TunedStudy:
    """A study tuned by ``autotune run`` in ``cwd`` into the SQLite file ``db``, and the CLI on
    it: what the real-engine tests (vLLM, transformers serve) share."""

    study = ""
    """The study's name in the database (each test's subclass sets it)."""

    def __init__(self, cwd: Path, db: Path, run: subprocess.CompletedProcess[str]) -> None:
        self.cwd, self.db, self.run = cwd, db, run

    @classmethod
    def tune(
        cls,
        cwd: Path,
        study_file: Path,
        trials: int,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> Self:
        """``autotune run --trials TRIALS`` of ``study_file`` in ``cwd``, into ``cwd/STUDY.db``
        (``env``: variables added to this process's for the run)."""
        db = cwd / f"{cls.study}.db"
        run = autotune_cli(
            "run",
            "--study-file", str(study_file),
            "--study", cls.study,
            "--storage", f"sqlite:///{db}",
            "--trials", str(trials),
            cwd=cwd,
            timeout=timeout,
            env=env,
        )  # fmt: skip
        return cls(cwd=cwd, db=db, run=run)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return autotune_cli(
            *args, "--study", self.study, "--storage", f"sqlite:///{self.db}", cwd=self.cwd
        )
