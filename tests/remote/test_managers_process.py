"""ProcessManager through LocalShell (and once through the real SSH shell): real detached
process groups, real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from managers_support import (
    GPU_USER,
    PY,
    SIM_OOM,
    fake_gpu,
    free_port,
    healthy,
    kill_groups,
    path_without,
    pidfile_pids,
    running,
    service_spec,
    sim_spec,
    wait_until,
)

from autotune.errors import ConfigError, LaunchError
from autotune.launch.classify import FailureClass, classify_line
from autotune.remote.managers import ProcessManager, create_manager
from autotune.remote.shell import LocalShell
from autotune.remote.ssh import HostPool
from autotune.specs import ServiceSpec


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "run"
    yield path
    kill_groups(pidfile_pids(path))


def manager(run_dir: Path, *, env: dict[str, str] | None = None, **kw: float) -> ProcessManager:
    return ProcessManager(shell=LocalShell(env=env), deployment="dep", run_dir=str(run_dir), **kw)


def log_text(run_dir: Path, name: str) -> str:
    return (run_dir / f"{name}.log").read_text()


def wait_log(run_dir: Path, name: str, needle: str, timeout_s: float = 10.0) -> str:
    assert wait_until(lambda: needle in log_text(run_dir, name), timeout_s=timeout_s), log_text(
        run_dir, name
    )
    return log_text(run_dir, name)


def kv(text: str, key: str) -> int:
    for word in text.split():
        if word.startswith(f"{key}="):
            return int(word.split("=", 1)[1])
    raise AssertionError(f"{key}= not in {text!r}")


def test_sim_server_runs_detached_and_stops(run_dir: Path) -> None:
    mgr = manager(run_dir)
    spec = sim_spec("decode")
    mgr.start(spec)
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=20), mgr.log_tail("decode")
    assert mgr.alive("decode")
    pid = int((run_dir / "decode.pid").read_text())
    # Detached into a session of its own: not our child, its own process group and session.
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid != os.getsid(0)
    meta = json.loads((run_dir / "decode.json").read_text())
    assert meta["pid"] == pid and meta["fingerprint"] == spec.fingerprint()
    assert oct((run_dir / "decode.json").stat().st_mode & 0o777) == "0o600"
    log = log_text(run_dir, "decode")
    assert log.startswith("=== autotune: start decode at ")
    assert "autotune.sim.server" in log.splitlines()[0]
    assert "fired up" in mgr.log_tail("decode")
    inv = mgr.inventory()
    assert inv["services"]["decode"]["alive"] is True and inv["services"]["decode"]["pid"] == pid

    mgr.stop("decode", grace_s=5)
    assert not mgr.alive("decode") and not running(pid)
    assert not (run_dir / "decode.pid").exists()
    assert not healthy(spec.health_url)
    assert "=== autotune: stopped decode" in log_text(run_dir, "decode")
    assert mgr.inventory()["services"] == {}
    mgr.stop("decode")  # idempotent


def test_stop_terminates_the_whole_process_group(run_dir: Path) -> None:
    mgr = manager(run_dir)
    mgr.start(service_spec("prefill", "--spawn-child"))
    child = kv(wait_log(run_dir, "prefill", "child="), "child")
    leader = int((run_dir / "prefill.pid").read_text())
    assert running(child) and os.getpgid(child) == leader
    t0 = time.monotonic()
    mgr.stop("prefill", grace_s=5)
    assert time.monotonic() - t0 < 4  # SIGTERM sufficed
    assert not running(child) and not running(leader)
    assert "(SIGTERM)" in log_text(run_dir, "prefill")


def test_sigkill_after_grace_for_a_process_ignoring_sigterm(run_dir: Path) -> None:
    mgr = manager(run_dir)
    mgr.start(service_spec("stubborn", "--ignore-sigterm"))
    wait_log(run_dir, "stubborn", "ignoring SIGTERM")
    pid = kv(log_text(run_dir, "stubborn"), "pid")
    t0 = time.monotonic()
    mgr.stop("stubborn", grace_s=0.6)
    elapsed = time.monotonic() - t0
    assert 0.5 <= elapsed < 5, elapsed
    assert not running(pid) and not mgr.alive("stubborn")
    assert "SIGKILL after grace" in log_text(run_dir, "stubborn")


@pytest.mark.parametrize("tools", ["ss", "python fallback"])
def test_start_waits_for_the_port_and_fails_fast_when_it_stays_taken(
    run_dir: Path, tmp_path: Path, tools: str
) -> None:
    env = None
    if tools != "ss":
        env = {**os.environ, "PATH": path_without(tmp_path, ["ss"])}
        assert LocalShell(env=env).run("command -v ss").exit_code != 0
    mgr = manager(run_dir, env=env, port_wait_s=0.5)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = int(holder.getsockname()[1])
    spec = service_spec("decode", port=port)
    with pytest.raises(LaunchError) as err:
        mgr.start(spec)
    assert err.value.failure == FailureClass.port_in_use.value and str(port) in str(err.value)
    assert not (run_dir / "decode.pid").exists()

    # Released while the start waits: the start goes ahead once the port is free.
    mgr.port_wait_s = 10.0
    threading.Timer(0.6, holder.close).start()
    t0 = time.monotonic()
    mgr.start(spec)
    assert time.monotonic() - t0 >= 0.5
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=10)
    mgr.stop(spec, grace_s=2)


def test_restart_replaces_the_running_instance_on_the_same_port(run_dir: Path) -> None:
    mgr = manager(run_dir)
    spec = service_spec("router")
    mgr.start(spec)
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=10)
    first = int((run_dir / "router.pid").read_text())
    mgr.start(spec)  # stops the old instance, waits for the port, starts again
    second = int((run_dir / "router.pid").read_text())
    assert second != first and not running(first)
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=10)
    assert log_text(run_dir, "router").count("=== autotune: start router") == 2
    assert "Address already in use" not in log_text(run_dir, "router")
    mgr.stop("router", grace_s=2)


def gpu_pids(gpu_dir: Path, count: int) -> list[int]:
    """The pids registered with the fake nvidia-smi, once there are ``count`` of them."""
    path = gpu_dir / "pids"
    assert wait_until(
        lambda: path.exists() and len(path.read_text().split()) >= count, timeout_s=10
    )
    return [int(p) for p in path.read_text().split()]


def test_start_waits_until_the_old_instance_gpu_memory_is_released(
    run_dir: Path, tmp_path: Path
) -> None:
    gpu_dir, env = fake_gpu(tmp_path, lag_s=1.0)
    mgr = manager(run_dir, env=env, gpu_wait_s=10)
    spec = ServiceSpec(
        name="decode",
        argv=(PY, "-c", GPU_USER),
        port=free_port(),
        health_url="http://127.0.0.1:1/health",
        log_file="/nonexistent",
    )
    mgr.start(spec)
    old = gpu_pids(gpu_dir, 1)[0]
    mgr.stop("decode", grace_s=2)
    assert not running(old)
    meta = json.loads((run_dir / "decode.json").read_text())
    assert old in meta["stopped_pids"]

    t0 = time.monotonic()
    mgr.start(spec)  # the fake reports the old pid's memory for 1 s after it exited
    assert time.monotonic() - t0 >= 0.8
    assert "--query-compute-apps=pid,used_memory" in (gpu_dir / "calls").read_text()
    new = gpu_pids(gpu_dir, 2)[1]

    mgr.gpu_wait_s = 0.3
    mgr.stop("decode", grace_s=2)
    with pytest.raises(LaunchError) as err:
        mgr.start(spec)
    assert f"pid {new} (4096 MiB)" in str(err.value)
    assert err.value.failure == FailureClass.unknown.value


def test_recycled_pid_is_not_mistaken_for_the_service(run_dir: Path) -> None:
    mgr = manager(run_dir)
    spec = service_spec("prefill")
    mgr.start(spec)
    mgr.stop("prefill", grace_s=2)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        ticks = int(Path(f"/proc/{stranger.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        meta = json.loads((run_dir / "prefill.json").read_text())
        (run_dir / "prefill.pid").write_text(f"{stranger.pid}\n")
        # Same pid, later start time: a different process now owns the number.
        meta.update(pid=stranger.pid, pgid=stranger.pid, start_ticks=ticks - 5, state="running")
        (run_dir / "prefill.json").write_text(json.dumps(meta))
        fresh = manager(run_dir)
        assert not fresh.alive("prefill")
        fresh.stop("prefill", grace_s=0.5)
        assert running(stranger.pid)  # not signalled
        assert not (run_dir / "prefill.pid").exists()
        # Control: with the matching start time the same pidfile is alive.
        (run_dir / "prefill.pid").write_text(f"{stranger.pid}\n")
        meta.update(start_ticks=ticks)
        (run_dir / "prefill.json").write_text(json.dumps(meta))
        assert manager(run_dir).alive("prefill")
    finally:
        stranger.kill()
        stranger.wait()


def has_oom(text: str) -> bool:
    hits = (classify_line(line) for line in text.splitlines())
    return any(hit is not None and hit[1] == FailureClass.cuda_oom for hit in hits)


def test_oom_is_classified_from_the_log_within_two_seconds(run_dir: Path) -> None:
    mgr = manager(run_dir)
    mgr.start(sim_spec("decode", *SIM_OOM))
    offset = 0
    seen = ""
    prev = time.monotonic()
    latency = None
    deadline = prev + 20
    while time.monotonic() < deadline:
        t = time.monotonic()
        text, offset = mgr.log_since("decode", offset)
        seen += text
        if has_oom(text):
            latency = time.monotonic() - prev  # the line appeared after the previous read
            break
        prev = t
        time.sleep(0.2)
    assert latency is not None, seen
    assert latency < 2.0
    found = mgr.classify("decode")
    assert found.failure == FailureClass.cuda_oom and "CUDA out of memory" in found.line
    assert wait_until(lambda: not mgr.alive("decode"), timeout_s=10)
    assert "=== autotune: exited with code" in mgr.log_tail("decode")
    assert not seen.startswith("=== autotune: start")  # the header is not part of the log


def test_values_reach_the_service_literally_and_never_run(run_dir: Path, tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    evil = [
        f"$(touch {canary}1)",
        f"`touch {canary}2`",
        f"; touch {canary}3",
        f"x' ; touch {canary}4 ; echo '",
        f'"; touch {canary}5; "',
        f"line1\ntouch {canary}6",
        "$HOME ${PATH} %n \\ * ?",
    ]
    env = {f"EVIL{i}": value for i, value in enumerate(evil)}
    args: list[str] = []
    for i, value in enumerate(evil):
        args += ["--log", f"ARG{i}<{value}>", "--print-env", f"EVIL{i}"]
    mgr = manager(run_dir)
    spec = service_spec("evil", *args, env=env, unset_env=["HOME"])
    mgr.start(spec)
    log = wait_log(run_dir, "evil", "listening=")
    for i, value in enumerate(evil):
        assert f"ARG{i}<{value}>" in log
        assert f"env EVIL{i}={value}" in log
    assert not list(tmp_path.glob("CANARY*"))
    # And through log_since.
    text, _ = mgr.log_since("evil", 0)
    assert f"ARG6<{evil[6]}>" in text
    mgr.stop("evil", grace_s=2)
    assert not list(tmp_path.glob("CANARY*"))


def test_unset_and_secret_environment(run_dir: Path) -> None:
    shell_env = {**os.environ, "DROP_ME": "inherited", "KEEP_ME": "inherited"}
    mgr = manager(run_dir, env=shell_env)
    spec = service_spec(
        "prefill",
        "--print-env",
        "DROP_ME",
        "--print-env",
        "KEEP_ME",
        "--print-env",
        "HF_TOKEN",
        env={"HF_TOKEN": "hunter2"},
        unset_env=["DROP_ME"],
    )
    mgr.start(spec)
    log = wait_log(run_dir, "prefill", "listening=")
    assert "env DROP_ME=<unset>" in log and "env KEEP_ME=inherited" in log
    assert "env HF_TOKEN=hunter2" in log  # the service gets the real value
    header = log.splitlines()[0]
    assert "'HF_TOKEN=<redacted>'" in header and "hunter2" not in header  # the header masks it
    mgr.stop("prefill", grace_s=2)


# ------------------------------------------------------------------ secrets on the host
CANARY_ENV = "hf_CANARYenv7Qz9"
CANARY_ARG = "sk-CANARYarg4Wm2"
ODD_VALUE = "a b 'q' \"dq\" $HOME `x` ;\nline2"
KEYED = (
    "import runpy, sys; sys.argv = sys.argv[3:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _cmdlines(pgid: int) -> dict[int, bytes]:
    """``/proc/PID/cmdline`` of every process of group ``pgid`` (the leader included)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2 :].split()[2] == str(pgid):
                out[int(entry.name)] = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
    return out


def _assert_secrets_stay_in_the_environment(mgr: ProcessManager, run_dir: Path) -> None:
    """Start a service with a secret variable and a secret flag; check every trace of it."""
    spec = service_spec(
        "keyed",
        "--print-env",
        "HF_TOKEN",
        "--print-env",
        "ODD",
        env={"HF_TOKEN": CANARY_ENV, "ODD": ODD_VALUE},
    )
    # python -c KEYED --api-key X service.py ...: the flag is on the service's own argv.
    argv = (PY, "-c", KEYED, "--api-key", CANARY_ARG, *spec.argv[1:])
    spec = spec.model_copy(update={"argv": argv})
    mgr.start(spec)
    log = wait_log(run_dir, "keyed", "listening=")
    assert f"env HF_TOKEN={CANARY_ENV}" in log  # the service gets the real values
    assert f"env ODD={ODD_VALUE}" in log
    leader = int((run_dir / "keyed.pid").read_text())
    service = kv(log, "pid")
    lines = _cmdlines(leader)
    assert {leader, service} <= set(lines)
    for pid, cmdline in lines.items():
        assert CANARY_ENV.encode() not in cmdline, (pid, cmdline)
    # ... while the variable is in the service's environment, as a variable should be.
    environ = Path(f"/proc/{service}/environ").read_bytes().split(b"\0")
    assert f"HF_TOKEN={CANARY_ENV}".encode() in environ
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert CANARY_ENV not in ps
    # Control: the flag's value is the server's own argv, so ps does show it: the check
    # above would have seen a value on a command line.
    assert CANARY_ARG in ps

    modes = {p.name: p.stat().st_mode & 0o777 for p in run_dir.iterdir()}
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert modes["keyed.env"] == modes["keyed.json"] == modes["keyed.log"] == 0o600
    assert CANARY_ENV in (run_dir / "keyed.env").read_text()  # control: it is in the file
    for name in ("keyed.json", "keyed.pid"):
        text = (run_dir / name).read_text()
        assert CANARY_ENV not in text and CANARY_ARG not in text, name
    header = log.splitlines()[0]
    assert header.startswith("=== autotune: start keyed")
    assert CANARY_ENV not in header and CANARY_ARG not in header and "<redacted>" in header
    # The service keeps the host shell's umask; only autotune's own files get 077.
    umask = int(Path(f"/proc/{service}/status").read_text().split("Umask:")[1].split()[0], 8)
    assert umask == int(subprocess.run(["sh", "-c", "umask"], capture_output=True,
                                       text=True).stdout, 8)  # fmt: skip
    mgr.restore("keyed")
    assert not (run_dir / "keyed.env").exists()


def test_environment_reaches_the_service_from_an_owner_only_file(run_dir: Path) -> None:
    _assert_secrets_stay_in_the_environment(manager(run_dir), run_dir)


def test_an_existing_world_readable_run_dir_and_log_are_tightened(run_dir: Path) -> None:
    run_dir.mkdir(mode=0o755)
    (run_dir / "svc.log").write_text("old run\n")
    (run_dir / "svc.log").chmod(0o644)
    mgr = manager(run_dir)
    mgr.start(service_spec("svc"))
    wait_log(run_dir, "svc", "listening=")
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert (run_dir / "svc.log").stat().st_mode & 0o777 == 0o600
    mgr.stop("svc", grace_s=2)


def test_invalid_variable_name_is_a_config_error(run_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not a valid environment variable name"):
        manager(run_dir).start(service_spec("svc", env={"A; touch x": "1"}))


def test_log_since_returns_complete_lines_since_the_last_start(run_dir: Path) -> None:
    mgr = manager(run_dir)
    mgr.start(service_spec("svc", "--log", "first-run"))
    wait_log(run_dir, "svc", "listening=")
    mgr.start(service_spec("svc", "--log", "second-run"))
    # (the header line names the argument too: wait for the service's own line)
    assert wait_until(lambda: "second-run" in mgr.log_since("svc", 0)[0], timeout_s=10)
    text, off = mgr.log_since("svc", 0)
    assert "second-run" in text and "first-run" not in text and "=== autotune: start" not in text
    assert text.endswith("\n")
    again, off2 = mgr.log_since("svc", off)
    assert off2 >= off and "second-run" not in again
    assert "first-run" not in mgr.log_tail("svc") and "second-run" in mgr.log_tail("svc")
    assert mgr.log_tail("svc", lines=1).count("\n") == 0
    mgr.stop("svc", grace_s=2)


def test_exit_is_seen_and_logged(run_dir: Path) -> None:
    mgr = manager(run_dir)
    mgr.start(service_spec("crash", "--exit-code", "3", "--log", "bye"))
    assert wait_until(lambda: not mgr.alive("crash"), timeout_s=10)
    tail = mgr.log_tail("crash")
    assert "=== autotune: exited with code 3" in tail and "bye" in tail
    assert mgr.classify("crash").failure == FailureClass.unknown


def test_restore_and_inventory(run_dir: Path) -> None:
    mgr = manager(run_dir)
    mgr.start(service_spec("prefill"))
    mgr.start(service_spec("decode"))
    inv = create_manager("process", shell=LocalShell(), deployment="dep", run_dir=str(run_dir))
    listed = inv.inventory()
    assert listed["manager"] == "process" and listed["run_dir"] == str(run_dir.resolve())
    assert set(listed["services"]) == {"prefill", "decode"}
    assert all(s["alive"] for s in listed["services"].values())
    pid = int((run_dir / "prefill.pid").read_text())
    inv.restore("prefill")
    assert not running(pid)
    assert not (run_dir / "prefill.pid").exists() and not (run_dir / "prefill.json").exists()
    assert (run_dir / "prefill.log").exists()  # evidence is kept
    assert set(inv.inventory()["services"]) == {"decode"}
    inv.restore("decode")
    assert inv.inventory()["services"] == {}


def test_default_run_dir_is_under_the_hosts_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mgr = ProcessManager(shell=LocalShell(env={**os.environ, "HOME": str(home)}), deployment="d1")
    assert mgr.run_dir == str(home / ".autotune" / "run" / "d1")
    spec = service_spec("svc")
    try:
        mgr.start(spec)
        assert (home / ".autotune" / "run" / "d1" / "svc.pid").exists()
    finally:
        mgr.stop("svc", grace_s=2)


def test_bad_names_and_missing_programs_are_config_errors(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="deployment"):
        ProcessManager(shell=LocalShell(), deployment="../x")
    mgr = manager(run_dir)
    with pytest.raises(ConfigError, match="service"):
        mgr.start(service_spec("a/b"))
    with pytest.raises(ConfigError, match="no-such-server-xyz"):
        mgr.start(service_spec("svc", argv0="no-such-server-xyz"))
    spec = service_spec("svc").model_copy(update={"workdir": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="working directory"):
        mgr.start(spec)
    assert not mgr.alive("svc")


def test_over_ssh_secrets_stay_in_an_owner_only_file(host_pool: HostPool, run_dir: Path) -> None:
    """The same checks through the real SSH shell: the environment file is uploaded (sftp,
    mode set before the content) and the start command carries no value."""
    mgr = ProcessManager(shell=host_pool.get("loopback"), deployment="dep", run_dir=str(run_dir))
    _assert_secrets_stay_in_the_environment(mgr, run_dir)


def test_over_ssh_the_service_outlives_the_connection(host_pool: HostPool, run_dir: Path) -> None:
    """The same manager through the real SSH shell (loopback sshd; skips without one)."""
    shell = host_pool.get("loopback")
    mgr = ProcessManager(shell=shell, deployment="dep", run_dir=str(run_dir))
    spec = service_spec("decode", "--spawn-child")
    t0 = time.monotonic()
    mgr.start(spec)
    assert time.monotonic() - t0 < 10  # the detached service does not hold the channel
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=10)
    child = kv(wait_log(run_dir, "decode", "child="), "child")
    shell.close()  # the SSH session ends: no SIGHUP reaches the new session
    time.sleep(0.3)
    assert healthy(spec.health_url) and running(child)
    assert mgr.alive("decode")  # reconnects
    mgr.stop("decode", grace_s=5)
    assert not running(child) and not mgr.alive("decode")
