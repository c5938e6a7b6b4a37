"""SSHShell and HostPool against real sshd processes (loopback and network namespaces)."""

from __future__ import annotations

import os
import shlex
import signal
import threading
import time
from pathlib import Path

import paramiko
import pytest
from sshd_hosts import SSHLab, free_port

from autotune.errors import ConfigError
from autotune.remote.hosts import HostSpec
from autotune.remote.shell import ShellError
from autotune.remote.ssh import WATCHDOG_GRACE_S, HostPool, SSHShell


def _wait_for(predicate: object, timeout_s: float = 5.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def _remote_tmpdir(shell: SSHShell) -> str:
    res = shell.run("mktemp -d /tmp/autotune-remote-test.XXXXXX")
    assert res.ok, res.stderr
    return res.stdout.strip()


# --------------------------------------------------------------------- commands
def test_runs_commands_on_every_host(host_pool: HostPool, sshd_lab: SSHLab) -> None:
    assert set(host_pool.names) == set(sshd_lab.servers)
    for name in host_pool.names:
        res = host_pool.get(name).run("echo out-$((40 + 2)); echo err >&2; exit 3")
        assert (res.exit_code, res.stdout, res.stderr) == (3, "out-42\n", "err\n")
        assert not res.ok
        ok = host_pool.get(name).run("printf '%s' \"$(id -un)\"")
        assert ok.ok and ok.stdout == "root"


def test_commands_are_posix_sh_and_quoting_survives(host_pool: HostPool) -> None:
    shell = host_pool.get("loopback")
    tricky = 'it\'s a "test" $HOME `x` ; & | * \\ ü'
    res = shell.run(f"printf '%s' {shlex.quote(tricky)}")
    assert res.stdout == tricky
    # sh, not the login shell's extensions: $0 of `sh -c` is "sh".
    assert shell.run('printf "%s" "$0"').stdout == "sh"


def test_namespaced_hosts_see_their_own_address(host_pool: HostPool, netns_lab: SSHLab) -> None:
    for role, ns in netns_lab.namespaces.items():
        others = [o.address for r, o in netns_lab.namespaces.items() if r != role]
        res = host_pool.get(role).run("ip -4 -o addr show")
        assert res.ok, res.stderr
        assert f"inet {ns.address}/30" in res.stdout
        assert not any(f"inet {addr}/" in res.stdout for addr in others)
        assert "inet 127.0.0.1/8" in res.stdout  # its own lo, brought up inside
    root_view = host_pool.get("loopback").run("ip -4 -o addr show").stdout
    assert all(f"inet {ns.root_address}/30" in root_view for ns in netns_lab.namespaces.values())


def test_one_connection_is_reused_for_many_commands(host_pool: HostPool, sshd_lab: SSHLab) -> None:
    server = sshd_lab.servers["loopback"]
    before = server.accepted_logins()
    shell = host_pool.get("loopback")
    transports = set()
    for i in range(20):
        assert shell.run(f"echo {i}").stdout == f"{i}\n"
        transports.add(id(shell.transport))
    assert len(transports) == 1
    assert shell.connections_opened == 1
    assert _wait_for(lambda: server.accepted_logins() == before + 1)
    time.sleep(0.1)
    assert server.accepted_logins() == before + 1


def test_dropped_connection_is_reopened_transparently(
    host_pool: HostPool, sshd_lab: SSHLab
) -> None:
    server = sshd_lab.servers["loopback"]
    shell = host_pool.get("loopback")
    for cut in range(1, 4):
        assert shell.run("true").ok
        first = shell.transport
        before = server.accepted_logins()
        assert server.kill_sessions() >= 1
        # Immediately: paramiko may or may not have noticed yet; both paths must recover.
        res = shell.run("echo back")
        assert res.stdout == "back\n"
        assert shell.transport is not first
        assert shell.connections_opened == 1 + cut
        assert _wait_for(lambda b=before: server.accepted_logins() == b + 1)
    # An idle connection that died between commands (noticed before the next one).
    assert server.kill_sessions() >= 1
    assert _wait_for(lambda: not shell.is_connected)
    assert shell.run("echo idle").stdout == "idle\n"
    assert shell.connections_opened == 5


def test_connection_lost_while_a_command_runs_is_not_retried(
    host_pool: HostPool, sshd_lab: SSHLab, tmp_path: Path
) -> None:
    # The loopback host shares this filesystem, so the marker is visible here.
    marker = tmp_path / "ran"
    server = sshd_lab.servers["loopback"]
    shell = host_pool.get("loopback")

    def cut_when_started() -> None:
        if _wait_for(marker.exists):
            server.kill_sessions()

    killer = threading.Thread(target=cut_when_started)
    killer.start()
    started = time.monotonic()
    with pytest.raises(ShellError, match="while the command was running"):
        shell.run(f"echo x >> {marker}; sleep 20")
    killer.join()
    assert time.monotonic() - started < 10
    assert marker.read_text() == "x\n"  # ran once, not retried
    assert shell.run("echo again").stdout == "again\n"


def test_host_that_stops_answering_is_a_shell_error_not_a_hang(
    ssh_host_specs: dict[str, HostSpec], sshd_lab: SSHLab
) -> None:
    # sshd frozen: the TCP connection is up, nothing answers the exec or SFTP request.
    # paramiko would wait forever; the watchdog closes the connection after the limit.
    server = sshd_lab.servers["loopback"]
    spec = ssh_host_specs["loopback"].model_copy(update={"command_timeout_s": 2.0})
    shell = SSHShell("loopback", spec)
    try:
        for attempt in ("command", "upload"):
            assert shell.run("true").ok  # a (new) connection, then the host freezes
            assert server.freeze_sessions() >= 1
            started = time.monotonic()
            try:
                with pytest.raises(ShellError, match="no answer from the host within"):
                    if attempt == "command":
                        shell.run("echo never", timeout_s=1)
                    else:
                        shell._upload(f"/tmp/autotune-frozen-{os.getpid()}", b"x", 0o600)
            finally:
                server.freeze_sessions(signal.SIGCONT)
            limit = 1 + WATCHDOG_GRACE_S if attempt == "command" else 2.0
            limit = min(limit, spec.connect_timeout_s)  # paramiko's channel-open timeout
            assert time.monotonic() - started < limit + 3, attempt
        assert shell.run("echo back").stdout == "back\n"  # a fresh connection works
    finally:
        shell.close()


def test_command_timeout_is_a_shell_error_and_keeps_the_connection(host_pool: HostPool) -> None:
    shell = host_pool.get("loopback")
    assert shell.run("true").ok
    transport = shell.transport
    started = time.monotonic()
    with pytest.raises(ShellError, match=r"timed out after 0\.5s: sleep 60") as info:
        shell.run("sleep 60", timeout_s=0.5)
    assert time.monotonic() - started < 30  # far below the sleep, with room for a busy machine
    assert info.value.host == "loopback"
    assert shell.run("echo alive").stdout == "alive\n"
    assert shell.transport is transport


def test_unreachable_host_is_a_clear_shell_error(sshd_lab: SSHLab) -> None:
    spec = sshd_lab.host_spec("loopback", port=free_port())
    shell = SSHShell("gone", spec)
    started = time.monotonic()
    with pytest.raises(
        ShellError, match=r"gone: cannot connect to root@127\.0\.0\.1:\d+: .*refused"
    ):
        shell.run("true")
    assert time.monotonic() - started < 15


def test_wrong_client_key_fails_authentication(sshd_lab: SSHLab, tmp_path: Path) -> None:
    import subprocess

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    shell = SSHShell("loopback", sshd_lab.host_spec("loopback", key_file=str(other)))
    with pytest.raises(ShellError, match=f"authentication failed .* key_file {other}"):
        shell.run("true")
    missing = SSHShell("loopback", sshd_lab.host_spec("loopback", key_file=str(tmp_path / "no")))
    with pytest.raises(ShellError, match="key_file .*no does not exist"):
        missing.run("true")


# --------------------------------------------------------------------- files
def test_put_text_writes_atomically_with_mode(host_pool: HostPool, sshd_lab: SSHLab) -> None:
    name = "prefill" if "prefill" in sshd_lab.servers else "loopback"
    shell = host_pool.get(name)
    base = _remote_tmpdir(shell)
    target = f"{base}/etc/autotune/unit.env"
    text = "A=1\nB='two words'\nC=ü\n"
    shell.put_text(target, text, mode=0o600)
    stat = shell.run(f"stat -c '%a %s %i' {target}").stdout.split()
    assert stat[0] == "600"
    assert int(stat[1]) == len(text.encode())
    assert shell.run(f"cat {target}").stdout == text
    assert shell.run(f"ls -A {base}/etc/autotune").stdout == "unit.env\n"  # no temp left

    shell.put_text(target, "A=2\n", mode=0o644)
    stat2 = shell.run(f"stat -c '%a %i' {target}").stdout.split()
    assert stat2[0] == "644"
    assert stat2[1] != stat[2]  # a new inode: renamed over, never rewritten in place
    assert shell.run(f"cat {target}").stdout == "A=2\n"
    assert shell.run(f"ls -A {base}/etc/autotune").stdout == "unit.env\n"
    shell.run(f"rm -rf {base}")


def test_put_text_failure_leaves_no_temp_file(host_pool: HostPool) -> None:
    shell = host_pool.get("loopback")
    base = _remote_tmpdir(shell)
    shell.run(f"mkdir {base}/taken && echo keep > {base}/taken/inside")
    with pytest.raises(ShellError, match="is a directory"):
        shell.put_text(f"{base}/taken", "x\n")
    assert shell.run(f"ls -A {base}").stdout == "taken\n"
    assert shell.run(f"cat {base}/taken/inside").stdout == "keep\n"

    shell.run(f"echo file > {base}/plain")
    with pytest.raises(ShellError, match="cannot create"):
        shell.put_text(f"{base}/plain/sub/x.conf", "x\n")
    with pytest.raises(ShellError, match="absolute"):
        shell.put_text("relative/x.conf", "x\n")
    assert sorted(shell.run(f"ls -A {base}").stdout.split()) == ["plain", "taken"]
    shell.run(f"rm -rf {base}")


# --------------------------------------------------------------------- sudo
def test_sudo_policy_decides_the_command_line(sshd_lab: SSHLab) -> None:
    def line(user: str, policy: str, sudo: bool) -> str:
        spec = sshd_lab.host_spec("loopback", user=user, sudo=policy)
        return SSHShell("h", spec).command_line("systemctl restart 'a b'", sudo=sudo)

    plain = "sh -c 'systemctl restart '\"'\"'a b'\"'\"''"
    assert line("deploy", "auto", True) == f"sudo -n {plain}"
    assert line("deploy", "auto", False) == plain
    assert line("root", "auto", True) == plain
    assert line("root", "always", True) == f"sudo -n {plain}"
    assert line("deploy", "always", False) == plain
    assert line("deploy", "never", True) == plain


def test_sudo_path_runs_through_sudo_on_the_host(sshd_lab: SSHLab) -> None:
    """``sudo: always`` as root exercises the real sudo route (install + mv). Where the
    host has no sudo, the command fails as such and put_text leaves nothing behind."""
    with HostPool({"h": sshd_lab.host_spec("loopback", sudo="always")}) as pool:
        shell = pool.get("h")
        has_sudo = shell.run("command -v sudo").ok
        res = shell.run("id -u", sudo=True)
        base = _remote_tmpdir(shell)
        target = f"{base}/conf/unit.service"
        if has_sudo:
            assert res.stdout == "0\n"
            shell.put_text(target, "[Unit]\n", mode=0o640, sudo=True)
            assert shell.run(f"stat -c '%a %U' {target}").stdout == "640 root\n"
            assert shell.run(f"ls -A {base}/conf").stdout == "unit.service\n"
        else:
            assert res.exit_code == 127 and "sudo" in res.stderr
            before = shell.run("ls -A /tmp | grep -c '^.autotune-put-' || true").stdout
            with pytest.raises(ShellError, match=f"cannot write {target}: .*sudo"):
                shell.put_text(target, "[Unit]\n", mode=0o640, sudo=True)
            after = shell.run("ls -A /tmp | grep -c '^.autotune-put-' || true").stdout
            assert after == before  # the staged copy in /tmp was removed
            assert shell.run(f"ls -A {base}").stdout == ""
        shell.run(f"rm -rf {base}")


# --------------------------------------------------------------------- pool, jump hosts
def test_jump_host_carries_the_connection(netns_lab: SSHLab) -> None:
    specs = {
        "gw": netns_lab.host_spec("loopback"),
        "decode": netns_lab.host_spec("decode", jump="gw"),
    }
    decode_ns = netns_lab.namespaces["decode"]
    server = netns_lab.servers["decode"]
    before = server.accepted_logins()
    with HostPool(specs) as pool:
        decode = pool.get("decode")
        gateway = pool.get("gw")
        assert not gateway.is_connected  # lazily
        res = decode.run("ip -4 -o addr show")
        assert f"inet {decode_ns.address}/30" in res.stdout
        assert gateway.is_connected
        transport = decode.transport
        assert transport is not None
        channel = transport.sock
        assert isinstance(channel, paramiko.Channel)  # a direct-tcpip channel, not a socket
        assert channel.get_transport() is gateway.transport
        # The decode sshd sees the connection come from the root namespace's veth end.
        client = decode.run('printf %s "${SSH_CLIENT%% *}"').stdout
        assert client == decode_ns.root_address
        # The gateway dropping takes the tunnelled connection with it; both come back.
        netns_lab.servers["loopback"].kill_sessions()
        assert _wait_for(lambda: not decode.is_connected)
        assert decode.run("echo via-new-gateway").stdout == "via-new-gateway\n"
        assert decode.transport is not None
        assert decode.transport.sock.get_transport() is gateway.transport
    assert not decode.is_connected and not gateway.is_connected
    assert _wait_for(lambda: server.accepted_logins() == before + 2)


def test_pool_is_lazy_shared_and_closes_everything(ssh_host_specs: dict[str, HostSpec]) -> None:
    pool = HostPool(ssh_host_specs)
    shells = [pool.get(name) for name in pool.names]
    assert all(pool.get(s.name) is s for s in shells)
    assert not any(s.is_connected for s in shells)
    for shell in shells:
        assert shell.run("true").ok
    assert all(s.is_connected for s in shells)
    pool.close_all()
    assert not any(s.is_connected for s in shells)
    with pytest.raises(ConfigError, match="unknown host 'nope'") as info:
        pool.get("nope")
    assert info.value.allowed == sorted(ssh_host_specs)


def test_pool_rejects_bad_jump_references(ssh_host_specs: dict[str, HostSpec]) -> None:
    spec = ssh_host_specs["loopback"]
    with pytest.raises(ConfigError, match="hosts.a.jump"):
        HostPool({"a": spec.model_copy(update={"jump": "missing"})}, file="d.yaml")
