"""The bundled `launchers/sim-dsv4-flash-pd-ssh.yaml` really runs over SSH (loopback sshd)."""

from __future__ import annotations

from pathlib import Path

import httpx
from sim_pd_hosts import REPO
from sshd_hosts import SSHLab

from autotune.deployment import load_deployment
from autotune.launch.factory import make_launcher
from autotune.ports import pick_free_ports
from autotune.render import render
from autotune.space import load_space


def test_bundled_sim_ssh_variant_runs_on_a_real_sshd(sshd_lab: SSHLab, tmp_path: Path) -> None:
    dep = load_deployment(REPO / "launchers" / "sim-dsv4-flash-pd-ssh.yaml")
    assert set(dep.hosts) == {"local-ssh"}
    dep.hosts["local-ssh"] = sshd_lab.host_spec("loopback", run_dir=str(tmp_path / "host-run"))
    # The file's fixed ports (31000, 31001, 31998) sit in the band every other test worker
    # picks `auto` ports from: on a busy CI run one of them once held 31000 here. The layout
    # is what this test checks, so the ports are the machine's: free ones, picked now.
    fixed = {
        dep.services["prefill"].port,
        dep.services["decode"].port,
        *dep.services["prefill"].ports.values(),
    }
    assert fixed == {31000, 31001, 31998}
    prefill, decode, bootstrap = pick_free_ports("127.0.0.1", 3, exclude=fixed)
    dep.services["prefill"].port = prefill
    dep.services["decode"].port = decode
    dep.services["prefill"].ports["bootstrap"] = bootstrap
    space = load_space(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    config = space.complete({**space.baseline_params(), "speculative": "off"})
    specs = render(space, dep, config, run_dir=tmp_path / "run")
    assert (specs["prefill"].port, specs["decode"].port) == (prefill, decode)
    assert str(bootstrap) in specs["decode"].argv
    launcher = make_launcher(dep, run_dir=tmp_path / "run")
    try:
        result = launcher.apply(specs)
        assert result.restarted == ["prefill", "decode", "router"] or set(result.restarted) == {
            "prefill",
            "decode",
            "router",
        }
        assert result.info["decode"]["disaggregation_mode"] == "decode"
        health = httpx.get(dep.endpoint_url(specs) + "/health", timeout=5)
        assert health.status_code == 200
        pidfiles = list((tmp_path / "host-run" / dep.name).glob("*.pid"))
        assert {p.stem for p in pidfiles} >= {"prefill", "decode"}
    finally:
        launcher.close()
    assert not any((tmp_path / "host-run" / dep.name).glob("prefill.pid"))
