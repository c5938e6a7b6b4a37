"""Issue 30, part 3, as a user would: the bundled simulated deployment runs as systemd units on
an SSH host; ``autotune init --from-systemd HOST:UNIT`` imports them over the test suite's real
sshd (``systemctl cat`` plus the ``EnvironmentFile=`` it names), the router from its command
line; ``autotune run --trials 3`` tunes from the written files, restarting the units through
autotune's drop-ins; ``autotune restore`` leaves them as they were.

The host: an sshd of the suite's lab (``tests/remote/sshd_hosts.py``: the lab's client key, its
own host key and ``known_hosts``) on 127.0.0.1, whose sessions find the remote tests' stand-in
systemd first on ``PATH``, with ``systemctl cat`` added by ``fake_systemctl/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from e2e_helpers import autotune_cli, load
from init_helpers import REPO
from optuna.trial import TrialState
from sshd_hosts import (
    FAKE_SYSTEMD_DIR,
    SYSTEM_PATH,
    SSHLab,
    SSHServer,
    acquire_lab,
    release_lab,
    skip_reason,
    wait_http,
)

from autotune.deployment import load_deployment
from autotune.ports import pick_free_port as free_port
from autotune.render import render
from autotune.unitfile import environment_line, exec_line

pytestmark = pytest.mark.slow

FAKE_CTL = Path(__file__).resolve().parent / "fake_systemctl"
TOKEN = "hf_CANARYtok3nQ7x9Lp2"
UNITS = {"prefill": "sim-prefill.service", "decode": "sim-decode.service"}


@dataclass
class Host:
    lab: SSHLab
    server: SSHServer
    units: Path
    state: Path
    known_hosts: Path

    def systemctl(self, *args: str) -> None:
        env = {
            **os.environ,
            "FAKE_SYSTEMD_UNIT_DIR": str(self.units),
            "FAKE_SYSTEMD_STATE_DIR": str(self.state),
        }
        subprocess.run(
            [sys.executable, str(FAKE_SYSTEMD_DIR / "systemctl"), *args],
            env=env, check=True, timeout=60,
        )  # fmt: skip


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    lab = acquire_lab(tmp_path_factory.mktemp("sshd-lab"))
    units, state = lab.root / "init-units", lab.root / "init-state"
    units.mkdir()
    state.mkdir()
    server = SSHServer(
        name="init-systemd",
        address="127.0.0.1",
        port=free_port(),
        directory=lab.root / "init-systemd",  # below the lab: its stale-process cleanup knows it
        authorized_keys=lab.authorized_keys,
        set_env={
            "PATH": f"{FAKE_CTL}:{FAKE_SYSTEMD_DIR}:{SYSTEM_PATH}",
            "FAKE_SYSTEMD_UNIT_DIR": str(units),
            "FAKE_SYSTEMD_STATE_DIR": str(state),
        },
    )
    server.directory.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(server.host_key)], check=True
    )
    server.start()
    known_hosts = lab.root / "init-known_hosts"
    known_hosts.write_text(server.known_hosts_line())
    found = Host(lab, server, units, state, known_hosts)
    try:
        yield found
    finally:
        for unit in UNITS.values():
            subprocess.run(
                [sys.executable, str(FAKE_SYSTEMD_DIR / "systemctl"), "stop", unit],
                env={**os.environ, "FAKE_SYSTEMD_UNIT_DIR": str(units),
                     "FAKE_SYSTEMD_STATE_DIR": str(state)},
                check=False, timeout=60,
            )  # fmt: skip
        server.stop()
        release_lab()


@pytest.fixture(scope="module")
def deployed(host: Host, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The bundled simulated deployment as it runs today: prefill and decode as units (part of
    their environment, and a credential, in an EnvironmentFile=; a second, optional one that
    does not exist), the router as a command line."""
    tmp = tmp_path_factory.mktemp("deployed")
    specs = render(
        None, load_deployment(REPO / "launchers" / "sim-dsv4-flash-pd.yaml"), {}, run_dir=tmp
    )
    for name, unit in UNITS.items():
        spec = specs[name]
        env_file = tmp / f"{name}.env"
        env_file.write_text(f"HF_TOKEN={TOKEN}\nAUTOTUNE_SIM_LOAD_SECONDS=0.2\n")
        inline = {k: v for k, v in spec.env.items() if k != "AUTOTUNE_SIM_LOAD_SECONDS"}
        (host.units / unit).write_text(
            f"[Unit]\nDescription=simulated SGLang {name}\n\n[Service]\n"
            + exec_line(list(spec.argv))
            + "\n"
            + "\n".join(environment_line(k, v) for k, v in inline.items())
            + f"\nEnvironmentFile={env_file}\nEnvironmentFile=-{tmp}/optional.env\n"
        )
    host.systemctl("daemon-reload")
    for unit in UNITS.values():
        host.systemctl("start", unit)
    for name in UNITS:
        wait_http(f"http://127.0.0.1:{specs[name].port}/health")
    return dict(specs)


def test_units_imported_over_ssh_tune_for_three_trials_then_restore(
    host: Host, deployed: dict[str, object], tmp_path: Path
) -> None:
    specs: dict[str, object] = deployed
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "gpu": {
                        "address": "127.0.0.1",
                        "port": host.server.port,
                        "user": "root",
                        "key_file": str(host.lab.client_key),
                        "known_hosts": str(host.known_hosts),
                        "run_dir": str(tmp_path / "host-run"),
                        "connect_timeout_s": 5,
                    }
                }
            }
        )
    )
    prefill = specs["prefill"]
    router = specs["router"]
    out = tmp_path / "project"
    init = autotune_cli(
        "init",
        "--from-systemd", f"gpu:{UNITS['prefill']}",
        "--from-systemd", f"gpu:{UNITS['decode']}",
        "--from-command", router.command_line(),  # type: ignore[attr-defined]
        "--hosts", str(hosts_file),
        "--url", f"http://127.0.0.1:{prefill.port}",  # type: ignore[attr-defined]
        "--name", "sim-imported",
        "--requests", "32",
        "--out", str(out),
        cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    said = init.stdout
    assert "sglang 0.5.23 (reported by" in said  # the running prefill's /server_info
    for name in UNITS:
        assert (
            f"environment variable HF_TOKEN of service {name} is left to its systemd unit" in said
        )
    written = [p.read_text() for p in out.rglob("*.yaml")]
    assert len(written) == 3 and not any(TOKEN in text for text in written)
    dep = yaml.safe_load((out / "launchers" / "sim-imported.yaml").read_text())
    assert list(dep["services"]) == ["prefill", "decode", "router"]
    for name, unit in UNITS.items():
        service = dep["services"][name]
        assert (service["on"], service["manager"], service["unit"]) == ("gpu", "systemd", unit)
        assert list(service["command"]) == list(specs[name].argv)  # type: ignore[attr-defined]
        assert "HF_TOKEN" not in service["env"]
        # from the EnvironmentFile= (read over SSH), carried as it is
        assert service["env"]["AUTOTUNE_SIM_LOAD_SECONDS"] == "0.2"
    assert dep["hosts"]["gpu"]["systemd_unit_dir"] == str(host.units)
    assert dep["services"]["router"]["depends_on"] == ["prefill", "decode"]
    assert dep["sim_speedup"] == 8

    # The imported files tune: the baseline first, then sampled trials through the drop-ins.
    db = tmp_path / "sim.db"
    common = ["--study", "sim-imported", "--storage", f"sqlite:///{db}",
              "--study-file", str(out / "studies" / "sim-imported.yaml")]  # fmt: skip
    autotune_cli("run", "--trials", "3", "--seed", "1", *common, cwd=tmp_path, timeout=600)
    trials = load("sim-imported", db).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    base = trials[0].user_attrs
    assert base["is_baseline"] and base["failure"] is None, base.get("reason")
    for name in UNITS:  # the baseline is what the units ran
        assert base["services"][name]["argv"] == list(specs[name].argv)  # type: ignore[attr-defined]
        assert base["engine_version"][name] == "0.5.23"
    assert base["metrics"]["completed"] == 32 and base["metrics"]["output_throughput"] > 0
    changed = [t for t in trials[1:] if t.user_attrs["config"] != base["config"]]
    assert changed, "a sampled trial ran another configuration"
    dropins = [host.units / f"{unit}.d" / "50-autotune.conf" for unit in UNITS.values()]
    assert any(p.exists() for p in dropins)

    # restore: the drop-ins go, the units run their own commands again.
    autotune_cli("restore", *common[:2], *common[4:], cwd=tmp_path, timeout=300)
    assert not any(p.exists() for p in dropins)
    for name, unit in UNITS.items():
        wait_http(f"http://127.0.0.1:{specs[name].port}/health")  # type: ignore[attr-defined]
        running = json.loads((host.state / "run" / f"{unit}.json").read_text())
        assert running["argv"] == list(specs[name].argv)  # type: ignore[attr-defined]


def test_a_unit_imports_from_user_at_address_with_a_key(
    host: Host, deployed: object, tmp_path: Path
) -> None:
    out = tmp_path / "inline"
    init = autotune_cli(
        "init",
        "--from-systemd", f"root@127.0.0.1:{host.server.port}:{UNITS['decode']}",
        "--ssh-key", str(host.lab.client_key),
        "--known-hosts", str(host.known_hosts),
        "--name", "decode-only",
        "--out", str(out),
        cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    assert "service decode: sglang 0.5.23 (decode, gpu)" in init.stdout
    dep = yaml.safe_load((out / "launchers" / "decode-only.yaml").read_text())
    assert dep["hosts"]["127.0.0.1"]["port"] == host.server.port
    assert dep["services"]["decode"]["unit"] == UNITS["decode"]
    missing = autotune_cli(
        "init",
        "--from-systemd", f"root@127.0.0.1:{host.server.port}:nope.service",
        "--ssh-key", str(host.lab.client_key),
        "--known-hosts", str(host.known_hosts),
        "--out", str(out),
        cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "No files found for nope.service" in missing.stderr


def test_a_unit_behind_a_jump_host_imports_with_the_jump_host(
    host: Host, deployed: object, tmp_path: Path
) -> None:
    bastion = host.lab.servers["loopback"]
    hosts_file = tmp_path / "hosts.yaml"
    common = {"user": "root", "key_file": str(host.lab.client_key), "connect_timeout_s": 5}
    hosts = {
        "bastion": {"address": bastion.address, "port": bastion.port,
                    "known_hosts": str(host.lab.known_hosts), **common},
        "gpu": {"address": "127.0.0.1", "port": host.server.port, "jump": "bastion",
                "known_hosts": str(host.known_hosts), **common},
    }  # fmt: skip
    hosts_file.write_text(yaml.safe_dump({"hosts": hosts}))
    before = bastion.accepted_logins()
    out = tmp_path / "jump"
    autotune_cli(
        "init", "--from-systemd", f"gpu:{UNITS['prefill']}", "--hosts", str(hosts_file),
        "--out", str(out), "--name", "behind", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert bastion.accepted_logins() > before  # the connection went through the jump host
    dep = yaml.safe_load((out / "launchers" / "behind.yaml").read_text())
    assert dep["hosts"]["gpu"]["jump"] == "bastion" and "bastion" in dep["hosts"]
    assert dep["services"]["prefill"]["on"] == "gpu"
