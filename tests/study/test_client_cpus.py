"""``client_cpus``: a real run keeps the load generator's core free of the local services.

The bundled simulated deployment with ``client_cpus`` set, run by ``autotune run``: every
service process (found in /proc while the run goes on) may run only on the other CPUs, and
the trial records the CPUs its load generator measured on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import E2E_STUDY, REPO, autotune_cli, load

from autotune.cpus import available_cpus, format_cpu_list

pytestmark = pytest.mark.skipif(len(available_cpus()) < 2, reason="needs two CPUs")


def _services_of(run_dir: Path) -> dict[int, frozenset[int]]:
    """pid -> allowed CPUs of every process started with this run directory."""
    marker = f"AUTOTUNE_LOCAL_RUN_DIR={run_dir}".encode()
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            program = (proc / "cmdline").read_bytes().split(b"\0")[0]
            if Path(program.decode(errors="replace")).name == "taskset":
                continue  # taskset itself, the instant before it places and execs the service
            if any(v.startswith(marker) for v in environ):
                out[int(proc.name)] = frozenset(os.sched_getaffinity(int(proc.name)))
        except OSError:  # gone meanwhile
            continue
    return out


def _study_with_client_cpus(tmp_path: Path, cpus: str) -> tuple[Path, Path]:
    """(study file, run directory): the e2e study on the bundled simulated deployment with
    ``client_cpus: CPUS``."""
    deployment = tmp_path / "sim-pinned.yaml"
    text = (REPO / "launchers" / "sim-dsv4-flash-pd.yaml").read_text()
    run_dir = tmp_path / "runs"
    text = text.replace("run_dir: studies/runs/${deployment}", f"run_dir: {run_dir}", 1)
    deployment.write_text(text.replace("\nservices:\n", f"\nclient_cpus: '{cpus}'\nservices:\n", 1))
    study = tmp_path / "study.yaml"
    study.write_text(
        E2E_STUDY.read_text()
        .replace("../../search_spaces/", f"{REPO}/search_spaces/")
        .replace("deployment: ../../launchers/sim-dsv4-flash-pd.yaml", f"deployment: {deployment}")
    )
    return study, run_dir


def test_a_placement_that_leaves_the_services_no_cpu_stops_before_any_trial(
    tmp_path: Path,
) -> None:
    study, _ = _study_with_client_cpus(tmp_path, format_cpu_list(available_cpus()))
    db = tmp_path / "s.db"
    proc = autotune_cli(
        "run", "--trials", "1", "--study", "pinned", "--storage", f"sqlite:///{db}",
        "--study-file", str(study), cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "field 'client_cpus'" in proc.stderr + proc.stdout
    assert "leaves no CPU for the services" in proc.stderr + proc.stdout
    assert load("pinned", db).get_trials() == []  # no trial asked, none left RUNNING


def test_local_services_run_off_the_load_generators_cpu(tmp_path: Path) -> None:
    mine = available_cpus()
    client = min(mine)
    study, run_dir = _study_with_client_cpus(tmp_path, str(client))
    db = tmp_path / "s.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", "--trials", "1", "--study", "pinned",
         "--storage", f"sqlite:///{db}", "--study-file", str(study)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: dict[int, frozenset[int]] = {}
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update(_services_of(run_dir.resolve()))
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    rest = mine - {client}
    assert len(seen) >= 3, (seen, out)  # prefill, decode, router (and their children)
    assert all(cpus == rest for cpus in seen.values()), seen
    (trial,) = load("pinned", db).get_trials()
    assert trial.user_attrs["client_cpus"] == str(client)
    for name, service in trial.user_attrs["services"].items():
        assert service["argv"][:3] == ["taskset", "-c", format_cpu_list(rest)], name
