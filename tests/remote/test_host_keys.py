"""Host key verification against real sshd, the ``hosts:`` map, and secrets never leaking."""

from __future__ import annotations

import getpass
import logging
import os
import subprocess
from pathlib import Path

import paramiko
import pytest
import yaml
from pydantic import ValidationError
from sshd_hosts import SSHLab, SSHServer

from autotune.errors import ConfigError
from autotune.remote.hosts import HostSpec, parse_hosts, validate_hosts
from autotune.remote.shell import ShellError
from autotune.remote.ssh import HostKeyError, HostPool, SSHShell


def _fingerprint(server: SSHServer) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(server.host_key.with_suffix(".pub"))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()[1]  # "256 SHA256:... comment (ED25519)"


# --------------------------------------------------------------------- unknown keys
def test_unknown_host_key_is_refused_by_default(sshd_lab: SSHLab, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    server = sshd_lab.servers["loopback"]
    shell = SSHShell("loopback", sshd_lab.host_spec("loopback", known_hosts=str(known)))
    for _ in range(2):  # the refused transport must not be left open for a second try
        with pytest.raises(HostKeyError) as info:
            shell.run("true")
        message = str(info.value)
        assert f"host key of 127.0.0.1:{server.port} is not in {known}" in message
        assert "ssh-keyscan/ssh or set accept_new_host_key: true" in message
        assert _fingerprint(server) in message
        assert not shell.is_connected
    assert known.read_text() == ""
    # A missing file is the same as an empty one (no crash, still refused).
    absent = SSHShell("h", sshd_lab.host_spec("loopback", known_hosts=str(tmp_path / "none")))
    with pytest.raises(HostKeyError, match="is not in"):
        absent.connect()
    assert not (tmp_path / "none").exists()


def test_accept_new_host_key_saves_it_and_later_connects_use_it(
    sshd_lab: SSHLab, tmp_path: Path
) -> None:
    known = tmp_path / "fresh" / ".ssh" / "known_hosts"  # directory created on demand
    server = sshd_lab.servers["loopback"]
    spec = sshd_lab.host_spec("loopback", known_hosts=str(known), accept_new_host_key=True)
    with HostPool({"h": spec}) as pool:
        assert pool.get("h").run("echo ok").stdout == "ok\n"
    assert known.read_text() == server.known_hosts_line()
    assert (known.stat().st_mode & 0o777) == 0o600
    strict = spec.model_copy(update={"accept_new_host_key": False})
    with HostPool({"h": strict}) as pool:
        assert pool.get("h").run("echo again").stdout == "again\n"
    with HostPool({"h": spec}) as pool:  # opted in, but the key is known: nothing appended
        pool.get("h").connect()
    assert known.read_text() == server.known_hosts_line()


def test_accepted_key_is_appended_to_an_existing_file(sshd_lab: SSHLab, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    some_key = " ".join(sshd_lab.client_key.with_suffix(".pub").read_text().split()[:2])
    hashed = paramiko.HostKeys.hash_host("gpu9.example")
    other = (
        "# a comment kept as is\n"
        "not a valid line\n"
        "@cert-authority *.example ssh-ed25519 AAAA\n"
        f"{hashed} {some_key}"  # no trailing newline
    )
    known.write_text(other)
    spec = sshd_lab.host_spec("loopback", known_hosts=str(known), accept_new_host_key=True)
    SSHShell("h", spec).connect()
    assert known.read_text() == other + "\n" + sshd_lab.servers["loopback"].known_hosts_line()


# --------------------------------------------------------------------- changed keys
def test_changed_host_key_is_refused_even_with_opt_in(sshd_lab: SSHLab, tmp_path: Path) -> None:
    server = sshd_lab.start_server("rekey")
    known = tmp_path / "known_hosts"
    spec = sshd_lab.host_spec("loopback", port=server.port, known_hosts=str(known))
    spec = spec.model_copy(update={"accept_new_host_key": True})
    with HostPool({"rekey": spec}) as pool:
        assert pool.get("rekey").run("true").ok
    saved = known.read_text()
    old_fp = _fingerprint(server)

    server.regenerate_host_key()  # a reinstalled host, or an impostor on its address
    server.restart()
    new_fp = _fingerprint(server)
    assert old_fp != new_fp
    with HostPool({"rekey": spec}) as pool:
        shell = pool.get("rekey")
        for _ in range(2):
            with pytest.raises(HostKeyError) as info:
                shell.run("true")
            message = str(info.value)
            assert f"host key of 127.0.0.1:{server.port} has CHANGED" in message
            assert str(known) in message
            assert old_fp in message and new_fp in message
            assert f"ssh-keygen -R '[127.0.0.1]:{server.port}' -f {known}" in message
            assert not shell.is_connected
    assert known.read_text() == saved  # never overwritten or appended to


def test_wrong_key_for_a_port_22_host_is_refused(netns_lab: SSHLab, tmp_path: Path) -> None:
    """known_hosts says the decode host has the loopback server's key (OpenSSH's bare-address
    form for port 22): refused as changed, whatever accept_new_host_key says."""
    decode = netns_lab.servers["decode"]
    wrong = netns_lab.servers["loopback"].known_hosts_line().split()[1:]
    known = tmp_path / "known_hosts"
    known.write_text(f"{decode.address} {' '.join(wrong)}\n")
    spec = netns_lab.host_spec("decode", known_hosts=str(known), accept_new_host_key=True)
    with pytest.raises(HostKeyError, match=f"host key of {decode.address}:22 has CHANGED"):
        SSHShell("decode", spec).run("true")
    with pytest.raises(HostKeyError, match=f"ssh-keygen -R '{decode.address}'"):
        SSHShell("decode", spec).run("true")


def test_jump_host_keys_are_verified_too(netns_lab: SSHLab, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(netns_lab.servers["decode"].known_hosts_line())  # gateway's key missing
    specs = {
        "gw": netns_lab.host_spec("loopback", known_hosts=str(known)),
        "decode": netns_lab.host_spec("decode", known_hosts=str(known), jump="gw"),
    }
    with HostPool(specs) as pool, pytest.raises(HostKeyError, match="^gw: host key of 127"):
        pool.get("decode").run("true")


# --------------------------------------------------------------------- secrets
def test_no_private_key_material_in_errors_or_logs(
    sshd_lab: SSHLab, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    wrong = tmp_path / "wrong_known_hosts"
    port = sshd_lab.servers["loopback"].port
    wrong.write_text(
        f"[127.0.0.1]:{port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2])
    )
    failing = [
        sshd_lab.host_spec("loopback", known_hosts=str(empty)),
        sshd_lab.host_spec("loopback", known_hosts=str(wrong), accept_new_host_key=True),
        sshd_lab.host_spec("loopback", key_file=str(other)),
        sshd_lab.host_spec("loopback", port=1),
    ]
    for spec in failing:
        with pytest.raises(ShellError) as info:
            SSHShell("h", spec).run("true")
        texts += [str(info.value), repr(info.value)]
    good = sshd_lab.host_spec("loopback")
    shell = SSHShell("h", good)
    assert shell.run("true").ok
    with pytest.raises(ShellError) as timeout:
        shell.run("sleep 2", timeout_s=0.2)
    texts += [str(timeout.value), repr(shell), repr(good), good.model_dump_json()]
    shell.close()
    texts += [caplog.text, sshd_lab.servers["loopback"].log_text()]
    assert "h: connected to root@127.0.0.1" in caplog.text  # logging was captured
    secret_lines = sshd_lab.private_key_lines() + [
        line.strip()
        for line in other.read_text().splitlines()
        if line.strip() and not line.startswith("-----")
    ]
    assert len(secret_lines) >= 2
    blob = "\n".join(texts)
    for line in secret_lines:
        assert line not in blob
        assert line[:24] not in blob


# --------------------------------------------------------------------- hosts: map
HOSTS_YAML = """
gw: {address: bastion.example, user: ops, key_file: ~/.ssh/id_ed25519}
gpu1:
  address: 10.0.0.11
  port: 2222
  jump: gw
  sudo: never
  accept_new_host_key: true
gpu2: 10.0.0.12
"""


def test_hosts_map_parses_with_defaults() -> None:
    hosts = parse_hosts(yaml.safe_load(HOSTS_YAML), file="deploy.yaml")
    assert set(hosts) == {"gw", "gpu1", "gpu2"}
    assert hosts["gpu1"].jump == "gw" and hosts["gpu1"].port == 2222
    assert hosts["gw"].key_path == os.path.expanduser("~/.ssh/id_ed25519")
    gpu2 = hosts["gpu2"]
    assert (gpu2.port, gpu2.user, gpu2.key_file, gpu2.jump) == (22, None, None, None)
    assert gpu2.known_hosts == "~/.ssh/known_hosts"
    assert gpu2.accept_new_host_key is False
    assert (gpu2.connect_timeout_s, gpu2.command_timeout_s, gpu2.sudo) == (10.0, 120.0, "auto")
    assert gpu2.login_user == getpass.getuser()
    assert hosts["gw"].endpoint == "bastion.example:22"


def test_password_in_yaml_is_refused_without_echoing_it() -> None:
    data = yaml.safe_load("gpu1: {address: 10.0.0.11, password: hunter2-secret}")
    with pytest.raises(ConfigError) as info:
        parse_hosts(data, file="deploy.yaml")
    message = str(info.value)
    assert info.value.field == "hosts.gpu1.password"
    assert "deploy.yaml" in message and "not supported" in message
    assert "key_file" in message and "agent" in message
    assert "hunter2" not in message
    with pytest.raises(ValidationError) as raw:
        HostSpec.model_validate({"address": "h", "password": "hunter2-secret"})
    assert "hunter2" not in str(raw.value)
    assert "password" not in HostSpec.model_fields


@pytest.mark.parametrize(
    ("yaml_text", "field", "allowed"),
    [
        ("a: {address: h, jump: nowhere}", "hosts.a.jump", []),
        ("a: {address: h, jump: a}\nb: h2", "hosts.a.jump", ["b"]),
        ("a: {address: h, sudo: maybe}", "hosts.a.sudo", ["auto", "always", "never"]),
        ("a: {address: h, prot: 22}", "hosts.a.prot", None),
        ("a: {port: 22}", "hosts.a.address", None),
        ("a: {address: h, port: 0}", "hosts.a.port", None),
        ("a: {address: 'h; rm -rf /'}", "hosts.a.address", None),
    ],
)
def test_hosts_map_errors_name_file_and_field(
    yaml_text: str, field: str, allowed: list[str] | None
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_hosts(yaml.safe_load(yaml_text), file="deploy.yaml")
    assert info.value.file == "deploy.yaml"
    assert info.value.field == field
    if allowed is not None:
        assert info.value.allowed == allowed
    if field == "hosts.a.prot":
        assert info.value.allowed is not None and "port" in info.value.allowed


def test_jump_cycles_are_refused() -> None:
    hosts = {
        "a": HostSpec(address="a", jump="b"),
        "b": HostSpec(address="b", jump="c"),
        "c": HostSpec(address="c", jump="a"),
        "d": HostSpec(address="d"),
    }
    with pytest.raises(ConfigError, match=r"cycle: a -> b -> c -> a") as info:
        validate_hosts(hosts, file="deploy.yaml")
    assert info.value.field == "hosts.a.jump"
    assert info.value.allowed == ["d"]
    validate_hosts({"a": HostSpec(address="a", jump="d"), "d": hosts["d"]}, file="x")
