"""Real OpenSSH servers standing in for GPU hosts, for the remote (SSH) tests.

What :func:`acquire_lab` builds (once per test process, shared by every user, torn down
when the last user releases it and, as a safety net, at interpreter exit):

1. **Preconditions.** Needs root, ``/usr/sbin/sshd`` (``scripts/test-deps.sh`` installs
   openssh-server), ``ssh-keygen`` and ``ip`` (iproute2). Otherwise the fixtures skip with
   the reason (:func:`skip_reason`).
2. **Keys**, in a pytest temporary directory: an ed25519 *client* key without passphrase
   (``client_key``), an ``authorized_keys`` holding its public half, and one ed25519 *host*
   key per sshd. Nothing under ``~/.ssh`` or ``/etc/ssh`` is read or written.
3. **Three sshd processes**, each ``/usr/sbin/sshd -D -f CONFIG -E LOG`` with a minimal
   config of its own (Port, ListenAddress, HostKey, AuthorizedKeysFile pointing at the
   temporary file, PasswordAuthentication/KbdInteractiveAuthentication no, UsePAM no,
   StrictModes no, PidFile in the temporary directory, ``Subsystem sftp internal-sftp``,
   PermitRootLogin prohibit-password, LogLevel VERBOSE into LOG). ``/run/sshd`` (the
   privilege separation directory) is created if missing.

   * ``loopback``: on ``127.0.0.1`` at a free port (bind to port 0, then released).
   * ``prefill`` and ``decode``: each in a network namespace of its own,
     ``at-prefill-<pid>`` / ``at-decode-<pid>``, joined to the root namespace by a veth pair
     with a /30 in ``10.231.X.0`` (root side ``.1``, namespace side ``.2``; X is the first
     free value, usually 1 and 2), ``lo`` up inside and a default route back to the root
     side. Their sshd listens on port 22 of the namespace address. The root namespace (the
     tuner) reaches them over the veth; the namespaces reach the root namespace at its veth
     address (``root_address``) but not each other (no IP forwarding is turned on: the host's
     sysctls are left alone). Only these namespaces and links carry traffic.
     If namespaces cannot be created (no CAP_SYS_ADMIN), the lab has ``loopback`` only and
     ``namespace_error`` says why.
4. **known_hosts**, written from the generated ``.pub`` files (no ssh-keyscan): one line
   per server, ``[127.0.0.1]:PORT ssh-ed25519 KEY`` for the loopback server and the bare
   address (OpenSSH's form for port 22) for the namespaced ones.
5. **Teardown**: session processes (children of each sshd) are killed, then each sshd;
   ``ip netns del`` removes the namespaces (and with them both veth ends). Before building,
   leftovers of crashed earlier runs are removed: ``at-prefill-*``/``at-decode-*``
   namespaces and ``at[pd]<pid>`` links whose pid is no longer alive (or is ours), and
   lab sshd processes whose lab's ``owner.pid`` names a dead process.

Other helpers: :func:`run_in_namespace` / :func:`popen_in_namespace` run programs inside
a namespace (e.g. an HTTP service on ``lab.namespaces["prefill"].address`` reachable from
the root namespace), :meth:`SSHLab.start_server` starts an extra loopback sshd (a test that
rotates its host key), :meth:`SSHServer.kill_sessions` cuts the connections an sshd serves
(SIGKILL of its session processes) while the listener stays up.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from autotune.ports import pick_free_port as free_port
from autotune.ports import pid_alive
from autotune.remote.hosts import HostSpec

FAKE_SYSTEMD_DIR = Path(__file__).resolve().parent / "fake_systemd"
SSHD = "/usr/sbin/sshd"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROLES = ("prefill", "decode")
NS_PREFIX = "at-"
SUBNET_LOCK = "/tmp/autotune-sshd-lab-subnets.lock"
OWNER_FILE = "owner.pid"  # in the lab directory: the pid of the process that built it
_NS_RE = re.compile(r"^at-(prefill|decode)-(\d+)$")
_SSHD_CMD_RE = re.compile(r"^(?:sshd: )?" + re.escape(SSHD) + r" -D -f (\S+) -E ")
_VETH_RE = re.compile(r"^at[pd](\d+)n?(@.*)?$")


def skip_reason() -> str | None:
    """Why the real-sshd tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (sshd on its own config, network namespaces)"
    if not os.path.exists(SSHD):
        return f"{SSHD} missing: run scripts/test-deps.sh (installs openssh-server)"
    for tool in ("ssh-keygen", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} missing: run scripts/test-deps.sh"
    return None


def _run(argv: list[str], *, check: bool = True, timeout: float = 30) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def run_in_namespace(
    ns: str, argv: list[str], *, timeout_s: float = 30, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside network namespace ``ns`` and wait for it (text output)."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=check,
    )


def popen_in_namespace(ns: str, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` inside ``ns`` (``ip netns exec`` execs it, so the pid is the program's)."""
    return subprocess.Popen(["ip", "netns", "exec", ns, *argv], **popen_kwargs)


def wait_port(address: str, port: int, *, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def wait_http(url: str, *, up: bool = True, timeout_s: float = 30) -> None:
    """Until ``url`` answers 200 (``up``) or stops answering 200; AssertionError on time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ok = httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok == up:
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} {'never answered 200' if up else 'still answers 200'}")


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent(int(entry.name)) == pid:
            out.append(int(entry.name))
    return out


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents before children."""
    out = [pid]
    for child in _children(pid):
        out += _tree(child)
    return out


def _kill_tree(pid: int) -> None:
    # Parents first: an sshd session killed after its command would still report the
    # command's exit status to the client; killed first, it reports nothing (a real drop).
    for member in _tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


# --------------------------------------------------------------------- servers
@dataclass
class SSHServer:
    """One running sshd."""

    name: str
    address: str
    port: int
    directory: Path
    authorized_keys: Path
    namespace: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    set_env: dict[str, str] = field(default_factory=dict)
    """Session environment (sshd ``SetEnv``): the lab puts the stand-in systemctl and
    journalctl first on PATH, as a host with systemd would have them."""

    @property
    def host_key(self) -> Path:
        return self.directory / "ssh_host_ed25519_key"

    @property
    def config(self) -> Path:
        return self.directory / "sshd_config"

    @property
    def log(self) -> Path:
        return self.directory / "sshd.log"

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def known_hosts_line(self) -> str:
        kind, key = (self.host_key.with_suffix(".pub").read_text().split() + ["", ""])[:2]
        return f"{self.known_hosts_name} {kind} {key}\n"

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def accepted_logins(self) -> int:
        """How many connections authenticated so far (sshd's "Accepted publickey")."""
        return self.log_text().count("Accepted publickey")

    def kill_sessions(self) -> int:
        """SIGKILL every connection this sshd serves (its session processes); the listener
        stays up. Returns how many connections were cut."""
        if self.proc is None:
            return 0
        sessions = _children(self.proc.pid)
        for pid in sessions:
            _kill_tree(pid)
        return len(sessions)

    def freeze_sessions(self, sig: signal.Signals = signal.SIGSTOP) -> int:
        """SIGSTOP (or SIGCONT) every connection this sshd serves: a host that is up but no
        longer answers (a frozen sshd, a host swapping to death). Returns the count."""
        if self.proc is None:
            return 0
        sessions = _children(self.proc.pid)
        for pid in sessions:
            for member in _tree(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, sig)
        return len(sessions)

    def regenerate_host_key(self) -> None:
        """A new host key (what a reinstalled host, or an impostor, presents)."""
        for path in (self.host_key, self.host_key.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        _keygen(self.host_key, comment=f"autotune-test-host-{self.name}")

    def write_config(self) -> None:
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.address}",
                    f"HostKey {self.host_key}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    f"PidFile {self.directory / 'sshd.pid'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    "AllowTcpForwarding yes",
                    "UseDNS no",
                    "PrintMotd no",
                    "Subsystem sftp internal-sftp",
                    "LogLevel VERBOSE",
                    # One line: for SetEnv, as for most keywords, the first line wins.
                    *(
                        [
                            "SetEnv "
                            + " ".join(f'{k}="{v}"' for k, v in sorted(self.set_env.items()))
                        ]
                        if self.set_env
                        else []
                    ),
                    "",
                ]
            )
        )

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        self.write_config()
        argv = [SSHD, "-D", "-f", str(self.config), "-E", str(self.log)]
        if self.namespace is not None:
            argv = ["ip", "netns", "exec", self.namespace, *argv]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if wait_port(self.address, self.port, timeout_s=0.2):
                return
        self.stop()
        raise RuntimeError(f"sshd {self.name} did not start; its log:\n{self.log_text()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            for child in _children(proc.pid):  # sessions outlive the listener otherwise
                _kill_tree(child)
            proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self) -> None:
        self.stop()
        self.start()


def _keygen(path: Path, *, comment: str) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


@dataclass
class Namespace:
    """A network namespace joined to the root namespace by a veth pair."""

    role: str
    name: str
    address: str  # inside the namespace
    root_address: str  # the root namespace's end of the veth
    veth: str  # root-side link name


@dataclass
class SSHLab:
    """Everything :func:`acquire_lab` built. ``servers`` by name: loopback, prefill, decode."""

    root: Path
    client_key: Path
    authorized_keys: Path
    known_hosts: Path
    servers: dict[str, SSHServer] = field(default_factory=dict)
    namespaces: dict[str, Namespace] = field(default_factory=dict)
    namespace_error: str | None = None
    _extra: list[SSHServer] = field(default_factory=list)

    @property
    def systemd_units(self) -> Path:
        """Unit directory of the stand-in systemd every lab host sees."""
        return self.root / "systemd-units"

    @property
    def systemd_state(self) -> Path:
        return self.root / "systemd-state"

    def host_spec(self, name: str, **overrides: Any) -> HostSpec:
        """A HostSpec for server ``name`` with the lab's key and known_hosts."""
        server = self.servers[name]
        values: dict[str, Any] = {
            "address": server.address,
            "port": server.port,
            "user": "root",
            "key_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "connect_timeout_s": 5.0,
            "command_timeout_s": 30.0,
        }
        values.update(overrides)
        return HostSpec(**values)

    def host_specs(self, **overrides: Any) -> dict[str, HostSpec]:
        return {name: self.host_spec(name, **overrides) for name in self.servers}

    def start_server(self, name: str) -> SSHServer:
        """An extra loopback sshd (own host key, same client key), stopped at teardown."""
        directory = self.root / name
        directory.mkdir()
        server = SSHServer(
            name=name,
            address="127.0.0.1",
            port=free_port(),
            directory=directory,
            authorized_keys=self.authorized_keys,
        )
        _keygen(server.host_key, comment=f"autotune-test-host-{name}")
        server.start()
        self._extra.append(server)
        return server

    def private_key_lines(self) -> list[str]:
        """The base64 body lines of the client's private key (to assert they never leak)."""
        return [
            line.strip()
            for line in self.client_key.read_text().splitlines()
            if line.strip() and not line.startswith("-----")
        ]

    def teardown(self) -> None:
        for server in [*self._extra, *self.servers.values()]:
            with contextlib.suppress(Exception):
                server.stop()
        for ns in self.namespaces.values():
            _delete_namespace(ns.name)
            _run(["ip", "link", "del", ns.veth], check=False)


# --------------------------------------------------------------------- namespaces
def _delete_namespace(name: str) -> None:
    pids = _run(["ip", "netns", "pids", name], check=False).split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run(["ip", "netns", "del", name], check=False)


def cleanup_stale() -> None:
    """Remove namespaces and links left by crashed earlier runs (their pid is dead, or is
    ours: we have not created ours yet)."""
    me = os.getpid()
    _kill_stale_sshd(me)
    for line in _run(["ip", "netns", "list"], check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NS_RE.match(name)
        if match and (int(match.group(2)) == me or not pid_alive(int(match.group(2)))):
            _delete_namespace(name)
    for line in _run(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        link = parts[1].strip()
        match = _VETH_RE.match(link)
        if match and (int(match.group(1)) == me or not pid_alive(int(match.group(1)))):
            _run(["ip", "link", "del", link.split("@")[0]], check=False)


def _kill_stale_sshd(me: int) -> None:
    """Kill lab sshd processes (``SSHD -D -f LAB/NAME/sshd_config``) whose lab's owner is
    dead or is us, or whose lab directory is gone."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        # sshd rewrites its title: "sshd: /usr/sbin/sshd -D -f CONFIG -E LOG [listener] ..."
        match = _SSHD_CMD_RE.match(raw.replace("\0", " "))
        if match is None:
            continue
        config = Path(match.group(1))
        if config.name != "sshd_config":
            continue
        owner = config.parent.parent / OWNER_FILE
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            if config.exists() or "sshd-lab" not in str(config):
                continue  # not ours to judge
            pid = -1
        if pid == me or pid == -1 or not pid_alive(pid):
            _kill_tree(int(entry.name))


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Held from reading the free subnets to assigning them: two test processes (xdist
    workers) picking at once would both take the first free one."""
    with open(SUBNET_LOCK, "a") as handle:  # closing it releases the lock
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _free_subnets(count: int) -> list[int]:
    used = set(re.findall(r"\b10\.231\.(\d+)\.", _run(["ip", "-o", "-4", "addr", "show"])))
    free = [x for x in range(1, 255) if str(x) not in used]
    if len(free) < count:
        raise RuntimeError("no free 10.231.X.0/30 subnet")
    return free[:count]


def _make_namespace(role: str, subnet: int) -> Namespace:
    pid = os.getpid()
    ns = Namespace(
        role=role,
        name=f"at-{role}-{pid}",
        address=f"10.231.{subnet}.2",
        root_address=f"10.231.{subnet}.1",
        veth=f"at{role[0]}{pid}",
    )
    peer = f"{ns.veth}n"
    _run(["ip", "netns", "add", ns.name])
    try:
        _run(["ip", "link", "add", ns.veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", ns.name])
        _run(["ip", "addr", "add", f"{ns.root_address}/30", "dev", ns.veth])
        _run(["ip", "link", "set", ns.veth, "up"])
        _run(["ip", "-n", ns.name, "addr", "add", f"{ns.address}/30", "dev", peer])
        _run(["ip", "-n", ns.name, "link", "set", peer, "up"])
        _run(["ip", "-n", ns.name, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns.name, "route", "add", "default", "via", ns.root_address])
    except Exception:
        _delete_namespace(ns.name)
        _run(["ip", "link", "del", ns.veth], check=False)
        raise
    return ns


# --------------------------------------------------------------------- the lab
def build_lab(root: Path) -> SSHLab:
    """Build the lab under ``root`` (see the module docstring). Caller tears it down."""
    cleanup_stale()
    lab = SSHLab(
        root=root,
        client_key=root / "client_ed25519",
        authorized_keys=root / "authorized_keys",
        known_hosts=root / "known_hosts",
    )
    (root / OWNER_FILE).write_text(f"{os.getpid()}\n")
    try:
        _keygen(lab.client_key, comment="autotune-test-client")
        lab.authorized_keys.write_text(lab.client_key.with_suffix(".pub").read_text())
        lab.authorized_keys.chmod(0o600)
        loopback = SSHServer(
            name="loopback",
            address="127.0.0.1",
            port=free_port(),
            directory=root / "loopback",
            authorized_keys=lab.authorized_keys,
        )
        servers = [loopback]
        try:
            with _subnet_lock():  # xdist workers build their labs side by side
                for role, subnet in zip(ROLES, _free_subnets(len(ROLES)), strict=True):
                    lab.namespaces[role] = _make_namespace(role, subnet)
        except Exception as exc:  # no CAP_SYS_ADMIN / CAP_NET_ADMIN: loopback only
            lab.namespace_error = f"cannot create network namespaces: {exc}"
            for ns in lab.namespaces.values():
                _delete_namespace(ns.name)
            lab.namespaces.clear()
        for role, ns in lab.namespaces.items():
            servers.append(
                SSHServer(
                    name=role,
                    address=ns.address,
                    port=22,
                    directory=root / role,
                    authorized_keys=lab.authorized_keys,
                    namespace=ns.name,
                )
            )
        lab.systemd_units.mkdir()
        lab.systemd_state.mkdir()
        session_env = {
            "PATH": f"{FAKE_SYSTEMD_DIR}:"
            + "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "FAKE_SYSTEMD_UNIT_DIR": str(lab.systemd_units),
            "FAKE_SYSTEMD_STATE_DIR": str(lab.systemd_state),
        }
        for server in servers:
            server.set_env = dict(session_env)
            server.directory.mkdir()
            _keygen(server.host_key, comment=f"autotune-test-host-{server.name}")
            lab.servers[server.name] = server
            server.start()
        lab.known_hosts.write_text("".join(s.known_hosts_line() for s in servers))
    except BaseException:
        lab.teardown()
        raise
    return lab


_lab: SSHLab | None = None
_users = 0


def acquire_lab(root: Path) -> SSHLab:
    """The process-wide lab, built on first use (in ``root``); pair with release_lab()."""
    global _lab, _users
    if _lab is None:
        _lab = build_lab(root)
        atexit.register(_teardown_now)
    _users += 1
    return _lab


def release_lab() -> None:
    global _users
    _users -= 1
    if _users <= 0:
        _teardown_now()


def _teardown_now() -> None:
    global _lab, _users
    lab, _lab, _users = _lab, None, 0
    if lab is not None:
        lab.teardown()
