"""Helpers of the service-manager tests: specs, a fake ``nvidia-smi``, the fake systemd.

Everything runs for real on this machine through :class:`LocalShell`: real processes, real
HTTP on 127.0.0.1, free ports. ``tests/remote/fake_systemd`` holds the stand-in
``systemctl``/``journalctl``; the fake ``nvidia-smi`` is written per test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from autotune.ports import pick_free_port as free_port
from autotune.remote.shell import LocalShell
from autotune.specs import ServiceSpec

PY = os.path.abspath(sys.executable)
TESTS = Path(__file__).resolve().parent.parent
SERVICE = TESTS / "launch" / "fixtures" / "service.py"
"""The launcher tests' stand-in server (--log, --print-env, --spawn-child, --ignore-sigterm)."""
FAKE_SYSTEMD = Path(__file__).resolve().parent / "fake_systemd"

SIM_OOM = (
    "--mem-fraction-static",
    "0.95",
    "--cuda-graph-max-bs-decode",
    "256",
    "--speculative-algorithm",
    "EAGLE",
    "--speculative-num-steps",
    "4",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "5",
)


def wait_until(pred: Callable[[], object], *, timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (PID 1 here may never reap)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def service_spec(
    name: str,
    *args: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    unset_env: Sequence[str] = (),
    manager: str = "process",
    unit: str | None = None,
    argv0: str = PY,
) -> ServiceSpec:
    """A spec running tests/launch/fixtures/service.py on a free port."""
    port = port or free_port()
    return ServiceSpec(
        name=name,
        argv=(argv0, str(SERVICE), "--port", str(port), *args),
        env=env or {},
        unset_env=tuple(unset_env),
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        log_file=f"/nonexistent/{name}.log",
        manager=manager,  # type: ignore[arg-type]
        unit=unit,
    )


def sim_spec(
    name: str,
    *extra: str,
    port: int | None = None,
    manager: str = "process",
    unit: str | None = None,
) -> ServiceSpec:
    """The simulated SGLang server (``--disaggregation-mode null``), loading for 0.1 s."""
    port = port or free_port()
    return ServiceSpec(
        name=name,
        argv=(
            PY,
            "-m",
            "autotune.sim.server",
            "--model-path",
            "/models/DeepSeek-V4-Flash",
            "--tp-size",
            "4",
            "--disaggregation-mode",
            "null",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra,
        ),
        env={"AUTOTUNE_SIM_LOAD_SECONDS": "0.1"},
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        log_file=f"/nonexistent/{name}.log",
        manager=manager,  # type: ignore[arg-type]
        unit=unit,
    )


def kill_groups(pids: Sequence[int]) -> None:
    """Teardown safety net: SIGKILL the process groups the tests started."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def pidfile_pids(run_dir: Path) -> list[int]:
    pids = []
    for path in run_dir.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            pids.append(int(json.loads(path.read_text())["pid"]))
    return pids


# ------------------------------------------------------------------ fake nvidia-smi
FAKE_NVIDIA_SMI = r"""#!/bin/sh
# Stand-in nvidia-smi: every pid listed in $FAKE_GPU_DIR/pids holds 4096 MiB while it runs
# and for $FAKE_GPU_LAG_S seconds after it exited (the driver frees memory asynchronously).
echo "$*" >> "$FAKE_GPU_DIR/calls"
exec "$FAKE_GPU_PY" - "$FAKE_GPU_DIR" "${FAKE_GPU_LAG_S:-0}" <<'EOF'
import os, sys, time
d, lag = sys.argv[1], float(sys.argv[2])
def running(pid):
    try:
        raw = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:].split()[0] not in ("Z", "X")
try:
    pids = [int(p) for p in open(os.path.join(d, "pids")).read().split()]
except OSError:
    pids = []
for pid in pids:
    dead = os.path.join(d, f"dead.{pid}")
    if running(pid):
        print(f"{pid}, 4096 MiB")
        continue
    if not os.path.exists(dead):
        open(dead, "w").write(str(time.time()))
    if time.time() - float(open(dead).read()) < lag:
        print(f"{pid}, 4096 MiB")
EOF
"""

GPU_USER = (
    "import os, sys, time\n"
    "open(os.path.join(os.environ['FAKE_GPU_DIR'], 'pids'), 'a').write(f'{os.getpid()}\\n')\n"
    "print('allocated', flush=True)\n"
    "time.sleep(300)\n"
)
"""A service that "allocates GPU memory": registers its pid with the fake nvidia-smi."""


def fake_gpu(tmp_path: Path, *, lag_s: float) -> tuple[Path, dict[str, str]]:
    """A bin directory with the fake nvidia-smi and the environment that enables it."""
    bin_dir = tmp_path / "gpu-bin"
    gpu_dir = tmp_path / "gpu"
    bin_dir.mkdir()
    gpu_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "FAKE_GPU_DIR": str(gpu_dir),
        "FAKE_GPU_LAG_S": str(lag_s),
        "FAKE_GPU_PY": PY,
    }
    return gpu_dir, env


def path_without(tmp_path: Path, missing: Sequence[str]) -> str:
    """A PATH with every program of the current PATH except ``missing`` (symlinks)."""
    farm = tmp_path / "bin-farm"
    farm.mkdir()
    for entry in os.environ.get("PATH", "").split(":"):
        if not entry or not os.path.isdir(entry):
            continue
        for prog in os.listdir(entry):
            src = os.path.join(entry, prog)
            dst = farm / prog
            if prog in missing or dst.exists() or not os.access(src, os.X_OK):
                continue
            dst.symlink_to(src)
    return str(farm)


# ------------------------------------------------------------------ fake systemd
class FakeSystemd:
    """A unit directory, a state directory and a LocalShell whose PATH finds the stand-ins."""

    def __init__(self, root: Path) -> None:
        self.unit_dir = root / "etc-systemd"
        self.state_dir = root / "fake-systemd-state"
        self.unit_dir.mkdir(parents=True)
        self.env = {
            **os.environ,
            "PATH": f"{FAKE_SYSTEMD}:{os.environ.get('PATH', '')}",
            "FAKE_SYSTEMD_UNIT_DIR": str(self.unit_dir),
            "FAKE_SYSTEMD_STATE_DIR": str(self.state_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.shell = LocalShell(name="fake-host", env=self.env)

    def write_unit(self, unit: str, exec_start: Sequence[str], *, env: str = "") -> Path:
        """A user's own unit (the one autotune overrides)."""
        path = self.unit_dir / unit
        lines = ["[Unit]", f"Description=stand-in {unit}", "", "[Service]", "Type=simple"]
        if env:
            lines.append(env)
        lines += ["ExecStart=" + " ".join(exec_start), "Restart=on-failure", "RestartSec=1"]
        lines += ["", "[Install]", "WantedBy=multi-user.target"]
        path.write_text("\n".join(lines) + "\n")
        return path

    def systemctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(FAKE_SYSTEMD / "systemctl"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def journal(self, unit: str) -> str:
        return subprocess.run(
            [str(FAKE_SYSTEMD / "journalctl"), "-u", unit, "-o", "cat", "--no-pager", "-q"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout

    def main_pid(self, unit: str) -> int:
        out = self.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip()
        return int(out or 0)

    def active(self, unit: str) -> str:
        return self.systemctl("is-active", unit).stdout.strip()

    def cleanup(self) -> None:
        run = self.state_dir / "run"
        pids = []
        for path in run.glob("*.json") if run.is_dir() else []:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                pids.append(int(json.loads(path.read_text())["pid"]))
        kill_groups(pids)
