"""``kill -9`` of the tuner while it measures a deployment on two SSH hosts, then resume.

The kill orphans a detached prefill process on one host and leaves the decode unit running
with the tuning drop-in on the other. The next ``autotune run`` must take the hosts over
(stop the orphan before starting its own, restart the unit), finish the study with every
invariant, and ``autotune restore`` must bring the decode host back to its own unit.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from e2e_helpers import E2E_STUDY, autotune_cli
from optuna.trial import TrialState
from reliability.reliability_support import assert_consistent, run_cli
from sim_pd_hosts import UNIT, install_original_unit, wait_health, write_sim_pd_files
from sshd_hosts import SSHLab

pytestmark = pytest.mark.slow


def _prefill_pids(addr: str) -> set[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"autotune.sim.server.*--host {addr}"], capture_output=True, text=True
    )
    return {int(p) for p in found.stdout.split()}


def test_kill_9_while_measuring_over_ssh_then_resume(netns_lab: SSHLab, tmp_path: Path) -> None:
    lab = netns_lab
    study_file, prefill_addr, decode_addr = write_sim_pd_files(
        lab, tmp_path, study_template=E2E_STUDY
    )
    install_original_unit(lab, decode_addr)
    url = f"sqlite:///{tmp_path / 'rel.db'}"

    killed = run_cli(
        tmp_path, "--trials", "3", failpoints="measure=kill", storage=url, study_file=study_file
    )
    assert killed.returncode == -9, killed.stderr
    orphans = _prefill_pids(prefill_addr)
    assert orphans, "the kill should have left the remote prefill running"
    wait_health(f"http://{prefill_addr}:30000", up=True)
    assert (lab.systemd_units / f"{UNIT}.d" / "50-autotune.conf").exists()

    resumed = run_cli(tmp_path, "--trials", "3", storage=url, study_file=study_file)
    assert resumed.returncode == 0, resumed.stderr
    trials = assert_consistent(tmp_path / "rel.db")
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["failure"] == "interrupted"
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 3
    baseline = [t for t in done if t.user_attrs.get("is_baseline")]
    assert len(baseline) == 1 and baseline[0].user_attrs["failure"] is None, baseline[0].user_attrs
    assert not (orphans & _prefill_pids(prefill_addr)), "the orphaned prefill survived"
    wait_health(f"http://{prefill_addr}:30000", up=False)  # the run stopped its own at the end

    autotune_cli(
        "restore", "--study", "rel", "--study-file", str(study_file), cwd=tmp_path,
    )  # fmt: skip
    assert not (lab.systemd_units / f"{UNIT}.d" / "50-autotune.conf").exists()
    running = json.loads((lab.systemd_state / "run" / f"{UNIT}.json").read_text())
    assert "--moe-runner-backend" not in running["argv"]
    wait_health(f"http://{decode_addr}:30001", up=True)
