"""The simulated prefill/decode deployment on :mod:`sshd_hosts`'s namespace hosts, for the
SSH deployment and crash-resume tests: the deployment and study files
(:func:`write_sim_pd_files`), the decode unit as a team runs it before tuning
(:func:`install_original_unit`, under the fake systemd of ``fake_systemd/``) and a health
wait.

Split from ``sshd_hosts.py``, which builds the hosts themselves (sshd, namespaces, keys):
this module only uses a built :class:`~sshd_hosts.SSHLab`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from sshd_hosts import FAKE_SYSTEMD_DIR, SSHLab, wait_http

UNIT = "sim-decode.service"
REPO = Path(__file__).resolve().parents[2]


def _sim_command(mode: str) -> list[str]:
    # The fake KV transfer backend (SGLang's --disaggregation-transfer-backend fake): the
    # namespaces reach the root namespace but not each other (no IP forwarding), so the
    # decode could not fetch the KV from the prefill's bootstrap server; with fake, it does
    # not wait for it (the router still waits for the prefill's answer before it streams).
    return [
        sys.executable,
        "-m",
        "autotune.sim.server",
        "--model-path",
        "/models/DeepSeek-V4-Flash",
        "--served-model-name",
        "${model}",
        "--tp-size",
        "4",
        "--disaggregation-mode",
        mode,
        "--disaggregation-transfer-backend",
        "fake",
        "--host",
        "${host}",
        "--port",
        "${port}",
        "--enable-metrics",
    ]


def write_sim_pd_files(
    lab: SSHLab, tmp: Path, *, study_template: Path, decode_manager: str = "systemd"
) -> tuple[Path, str, str]:
    """A deployment of the simulated PD servers on the lab's namespace hosts (prefill as a
    detached process, decode under ``decode_manager``, router on this machine) and a study
    file from ``study_template`` using it. Returns (study file, prefill addr, decode addr)."""
    prefill_ns, decode_ns = lab.namespaces["prefill"], lab.namespaces["decode"]
    sim_env = {"AUTOTUNE_SIM_LOAD_SECONDS": "0.2", "AUTOTUNE_SIM_SPEEDUP": "${sim_speedup}"}
    host = {
        "run_dir": str(tmp / "host-run"),
        "port": 22,
        "user": "root",
        "key_file": str(lab.client_key),
        "known_hosts": str(lab.known_hosts),
        "connect_timeout_s": 5,
    }
    deployment = {
        "name": "sim-pd-ssh-test",
        "endpoint": "http://${router.host}:${router.port}",
        "model": "deepseek-ai/DeepSeek-V4-Flash",
        "sim_speedup": 8,
        "run_dir": str(tmp / "runs"),
        "hosts": {
            "gpu-a": {"address": prefill_ns.address, **host},
            "gpu-b": {
                "address": decode_ns.address,
                **host,
                "systemd_unit_dir": str(lab.systemd_units),
            },
        },
        "services": {
            "prefill": {
                "on": "gpu-a",
                "manager": "process",
                "command": _sim_command("prefill"),
                "env": sim_env,
                "host": prefill_ns.address,
                "port": 30000,
                "health": {"url": "http://${host}:${port}/health", "timeout_s": 30},
                "info_url": "http://${host}:${port}/server_info",
            },
            "decode": {
                "on": "gpu-b",
                "manager": decode_manager,
                **({"unit": UNIT} if decode_manager == "systemd" else {}),
                "command": _sim_command("decode"),
                "env": sim_env,
                "host": decode_ns.address,
                "port": 30001,
                "health": {"url": "http://${host}:${port}/health", "timeout_s": 30},
                "info_url": "http://${host}:${port}/server_info",
            },
            "router": {  # the real SGLang PD router, flags as in sim-dsv4-flash-pd.yaml
                "manager": "local",
                "command": [
                    sys.executable,
                    "-m",
                    "sglang_router.launch_router",
                    "--pd-disaggregation",
                    "--prefill",
                    "http://${prefill.host}:${prefill.port}",
                    "8998",
                    "--decode",
                    "http://${decode.host}:${decode.port}",
                    "--host",
                    "${host}",
                    "--port",
                    "${port}",
                    "--prometheus-host",
                    "${host}",
                    "--prometheus-port",
                    "${ports.prometheus}",
                    "--log-level",
                    "warn",
                    "--disable-circuit-breaker",
                    "--disable-retries",
                    "--disable-health-check",
                    "--worker-startup-check-interval",
                    "1",
                    "--shutdown-grace-period-secs",
                    "1",
                ],
                "env": {"HF_ENDPOINT": "http://127.0.0.1:9"},
                "host": "127.0.0.1",
                "port": "auto",
                "ports": {"prometheus": "auto"},
                "health": {"url": "http://${host}:${port}/readiness", "timeout_s": 30},
            },
        },
    }
    dep_file = tmp / "deployment.yaml"
    dep_file.write_text(yaml.safe_dump(deployment, sort_keys=False))
    study = yaml.safe_load(study_template.read_text())
    study.update(
        name="ssh",
        space=str(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"),
        deployment=str(dep_file),
    )
    study_file = tmp / "ssh.yaml"
    study_file.write_text(yaml.safe_dump(study, sort_keys=False))
    return study_file, prefill_ns.address, decode_ns.address


def install_original_unit(lab: SSHLab, decode_addr: str) -> None:
    """The decode unit as the team runs it before tuning: active, its own command."""
    (lab.systemd_units / UNIT).write_text(
        "[Unit]\nDescription=simulated SGLang decode\n\n[Service]\n"
        f"ExecStart={sys.executable} -m autotune.sim.server --model-path /models/DeepSeek-V4-Flash "
        f"--tp-size 4 --disaggregation-mode decode --host {decode_addr} --port 30001\n"
        "Environment=AUTOTUNE_SIM_LOAD_SECONDS=0.1 MARKER=original\n"
    )
    env = {
        "FAKE_SYSTEMD_UNIT_DIR": str(lab.systemd_units),
        "FAKE_SYSTEMD_STATE_DIR": str(lab.systemd_state),
    }
    systemctl = str(FAKE_SYSTEMD_DIR / "systemctl")
    ns = lab.namespaces["decode"].name
    for args in (["daemon-reload"], ["start", UNIT]):
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "env",
                *[f"{k}={v}" for k, v in env.items()],
                systemctl,
                *args,
            ],
            check=True,
            timeout=30,
        )
    wait_health(f"http://{decode_addr}:30001", up=True)


def wait_health(url: str, *, up: bool, timeout: float = 20) -> None:
    """Until the server at ``url`` is healthy (``up``) or gone."""
    wait_http(url + "/health", up=up, timeout_s=timeout)
