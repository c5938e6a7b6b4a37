"""Issue 3 end to end: the simulated PD deployment on two SSH "hosts" (network namespaces,
each with its own sshd): prefill as a detached process, decode as a systemd unit (stand-in
systemctl on the remote PATH), router on this machine; `autotune run`, then `restore`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from e2e_helpers import E2E_STUDY, autotune_cli
from optuna.trial import TrialState
from sim_pd_hosts import UNIT, install_original_unit, wait_health, write_sim_pd_files
from sshd_hosts import SSHLab

pytestmark = pytest.mark.slow


def test_run_8_trials_over_ssh_then_restore(netns_lab: SSHLab, tmp_path: Path) -> None:
    lab = netns_lab
    study_file, prefill_addr, decode_addr = write_sim_pd_files(
        lab, tmp_path, study_template=E2E_STUDY
    )
    install_original_unit(lab, decode_addr)
    db = tmp_path / "ssh.db"
    common = ["--study", "ssh", "--storage", f"sqlite:///{db}", "--study-file", str(study_file)]
    started = time.monotonic()
    autotune_cli("run", "--trials", "8", "--seed", "5", *common, cwd=tmp_path, timeout=900)
    elapsed = time.monotonic() - started

    study = optuna.load_study(study_name="ssh", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    assert len(trials) == 8 and all(t.state == TrialState.COMPLETE for t in trials)
    launched = [t for t in trials if "restarted" in t.user_attrs]
    assert len(launched) >= 5
    measured = [t for t in launched if t.user_attrs["failure"] is None]
    assert measured, [t.user_attrs.get("reason") for t in launched]
    for t in measured:  # /server_info over the veth: the tuned flags are what runs
        effective = t.user_attrs["effective"]
        assert effective["decode"]["port"] == 30001
        for name in ("prefill", "decode"):
            wanted = t.user_attrs["config"]["moe_runner_backend"]
            got = effective[name]["moe_runner_backend"]
            if wanted == "auto":  # the server reports what auto resolved to, never "auto"
                assert got != "auto", (t.number, name)
            else:
                assert got == wanted, (t.number, name)
    # Only services whose rendered spec changed were restarted over SSH. Compared with the
    # previous launch attempt, failed ones included: a launch that fails (decode OOM) has
    # already restarted the services that came up, and those keep running.
    attempts = [
        t
        for t in trials
        if "services" in t.user_attrs
        and t.user_attrs.get("reused_from") is None
        and t.user_attrs.get("failure") != "forbidden"
    ]
    previous = None
    checked = 0
    for t in attempts:
        services = t.user_attrs["services"]
        if (
            previous is not None
            and previous.user_attrs["failure"] is None
            and "restarted" in t.user_attrs
        ):
            for name in ("prefill", "decode"):
                changed = (
                    services[name]["fingerprint"]
                    != previous.user_attrs["services"][name]["fingerprint"]
                )
                assert (name in t.user_attrs["restarted"]) == changed, (t.number, name)
                checked += 1
        previous = t
    assert checked >= 4
    assert elapsed < 600

    # Install the winner for good: it keeps running after autotune exits.
    out = autotune_cli("apply", "--best", *common, cwd=tmp_path)
    assert "installed" in out.stdout
    dropin = lab.systemd_units / f"{UNIT}.d" / "50-autotune.conf"
    assert dropin.exists() and "ExecStart=" in dropin.read_text()
    wait_health(f"http://{decode_addr}:30001", up=True)
    wait_health(f"http://{prefill_addr}:30000", up=True)

    # Leave both hosts as found.
    autotune_cli("restore", *common[:2], "--study-file", str(study_file), cwd=tmp_path)
    assert not (lab.systemd_units / f"{UNIT}.d" / "50-autotune.conf").exists()
    wait_health(f"http://{decode_addr}:30001", up=True)  # the original unit runs again
    running = json.loads((lab.systemd_state / "run" / f"{UNIT}.json").read_text())
    assert "--moe-runner-backend" not in running["argv"]  # its own command, no tuned flags
    assert running["argv"][-4:] == ["--host", decode_addr, "--port", "30001"]
    wait_health(f"http://{prefill_addr}:30000", up=False)  # the tuner-started process is gone
    leftover = subprocess.run(
        ["pgrep", "-f", f"autotune.sim.server.*--host {prefill_addr}"],
        capture_output=True,
        text=True,
    )
    assert leftover.stdout.strip() == ""
