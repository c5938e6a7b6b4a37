"""Facts about a host and bounded waits on it, each one :class:`Shell` round trip.

Waits run as loops on the host (one command over SSH instead of one per poll). The scripts
are constant text; every value reaches them as a positional parameter (``set -- ...``) made
of ``shlex.quote`` d words, so nothing a user wrote is ever parsed by the host's shell.
Scripts print facts; the Python side decides what they mean.
"""

from __future__ import annotations

import base64
import binascii
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.remote.shell import Shell

POLL_S = 0.1
"""Host-side polling interval of the wait loops."""


def script(body: str, *args: object) -> str:
    """``set -- 'a' 'b'`` followed by ``body``: the arguments are ``$1``, ``$2``, ..."""
    words = " ".join(shlex.quote(str(a)) for a in args)
    return f"set -- {words}\n{body}" if args else body


def host_path(path: str) -> str:
    """``path`` as one shell word; a leading ``~/`` becomes the host's ``$HOME``."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def resolve_dir(shell: Shell, path: str, *, create: bool, mode: int | None = None) -> str:
    """The absolute path of directory ``path`` on the host (relative: under ``$HOME``);
    symlinks resolved when it exists, created first with ``create`` and then given ``mode``
    (the directory itself, not its parents)."""
    word = host_path(path if path.startswith(("/", "~")) else f"~/{path}")
    make = f"mkdir -p {word} && " if create else ""
    if create and mode is not None:
        make += f"chmod {mode:o} {word} && "
    res = shell.run(f"{make}cd {word} 2>/dev/null && pwd -P || printf '%s\\n' {word}")
    out = res.stdout.strip()
    return out if out.startswith("/") else path


@dataclass(frozen=True)
class ProcInfo:
    """One process as ``/proc/PID/stat`` shows it (``state`` ``?`` where there is no /proc)."""

    pid: int
    state: str
    pgid: int
    start_ticks: int | None

    @property
    def running(self) -> bool:
        """Not a zombie: zombies answer ``kill -0`` but hold nothing and do nothing."""
        return self.state not in ("Z", "X")


_PROC_INFO = r"""
pid=$1
if [ -r "/proc/$pid/stat" ]; then
  sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null
elif kill -0 "$pid" 2>/dev/null; then
  echo nostat
fi
"""


def proc_info(shell: Shell, pid: int) -> ProcInfo | None:
    """The process ``pid`` on the host, or None when there is none."""
    return parse_stat(pid, shell.run(script(_PROC_INFO, pid)).stdout)


def parse_stat(pid: int, text: str) -> ProcInfo | None:
    """Parse what ``/proc/PID/stat`` shows after the command name (or ``nostat``)."""
    text = text.strip()
    if not text:
        return None
    if text == "nostat":
        return ProcInfo(pid=pid, state="?", pgid=pid, start_ticks=None)
    fields = text.split()
    try:
        # After "(comm) ": state ppid pgrp session ... starttime is the 20th field.
        return ProcInfo(pid=pid, state=fields[0], pgid=int(fields[2]), start_ticks=int(fields[19]))
    except (IndexError, ValueError):
        return None


def group_members(shell: Shell, pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid`` on the host."""
    res = shell.run("ps -eo pid=,pgid=,stat=")
    return _members(res.stdout, pgid)


def _members(ps_output: str, pgid: int) -> list[int]:
    pids = []
    for line in ps_output.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == str(pgid) and not parts[2].startswith(("Z", "X")):
            pids.append(int(parts[0]))
    return sorted(pids)


_TERMINATE = r"""
pg=$1; grace=$2
members() {
  ps -eo pid=,pgid=,stat= | awk -v g="$pg" '$2 == g && $3 !~ /^[ZX]/ { printf "%s ", $1 }'
}
m=$(members)
echo "members $m"
[ -n "$m" ] || { echo gone; exit 0; }
kill -TERM "-$pg" 2>/dev/null
i=0
while [ -n "$(members)" ] && [ "$i" -lt "$grace" ]; do sleep 0.1; i=$((i + 1)); done
if [ -n "$(members)" ]; then
  kill -KILL "-$pg" 2>/dev/null
  echo killed
  i=0
  while [ -n "$(members)" ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
fi
if [ -n "$(members)" ]; then echo "stuck $(members)"; else echo stopped; fi
"""


@dataclass(frozen=True)
class TerminateResult:
    """What :func:`terminate_group` did: the members it found, whether SIGKILL was needed,
    and the members still there afterwards (uninterruptible sleep)."""

    members: list[int]
    killed: bool
    stuck: list[int]


def terminate_group(shell: Shell, pgid: int, *, grace_s: float) -> TerminateResult:
    """SIGTERM process group ``pgid``, SIGKILL it after ``grace_s``, wait until it is gone."""
    ticks = max(0, round(grace_s / POLL_S))
    res = shell.run(script(_TERMINATE, pgid, ticks), timeout_s=grace_s + 30.0)
    members: list[int] = []
    killed = False
    stuck: list[int] = []
    for line in res.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "members":
            members = [int(p) for p in rest.split()]
        elif word == "killed":
            killed = True
        elif word == "stuck":
            stuck = [int(p) for p in rest.split()]
    return TerminateResult(members=members, killed=killed, stuck=stuck)


_PORT_WAIT = r"""
host=$1; port=$2; n=$3
busy() {
  if command -v ss >/dev/null 2>&1; then
    [ -n "$(ss -ltnH "sport = :$port" 2>/dev/null)" ]
  elif command -v python3 >/dev/null 2>&1; then
    ! python3 -c 'import socket, sys
h, p = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((h, p))' "$host" "$port" 2>/dev/null
  else
    return 1
  fi
}
i=0
while busy; do
  if [ "$i" -ge "$n" ]; then echo busy; exit 0; fi
  sleep 0.1; i=$((i + 1))
done
echo free
"""


def wait_port_free(shell: Shell, *, host: str, port: int, timeout_s: float) -> bool:
    """Wait (bounded) until nothing listens on ``port`` on the host.

    ``ss -ltnH "sport = :PORT"`` (any address) where ``ss`` exists, else a ``python3`` bind
    test of ``host:port`` with ``SO_REUSEADDR`` like the servers use; with neither the port
    counts as free (the server's own "Address already in use" is then classified).
    """
    ticks = max(0, round(timeout_s / POLL_S))
    res = shell.run(script(_PORT_WAIT, host, port, ticks), timeout_s=timeout_s + 30.0)
    return res.stdout.strip().endswith("free")


_GPU_WAIT = r"""
pids=" $1 "; n=$2
command -v nvidia-smi >/dev/null 2>&1 || { echo no-nvidia-smi; exit 0; }
i=0
while :; do
  held=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null |
    awk -F', *' -v p="$pids" 'index(p, " " $1 " ") { printf "%s=%s;", $1, $2 }')
  [ -n "$held" ] || { echo released; exit 0; }
  [ "$i" -lt "$n" ] || { echo "held $held"; exit 0; }
  sleep 0.2; i=$((i + 2))
done
"""


def wait_gpu_released(shell: Shell, *, pids: Iterable[int], timeout_s: float) -> dict[int, str]:
    """Wait (bounded) until no GPU compute context of ``pids`` is left on the host.

    A process's GPU memory is freed after it exits, not when it exits; a server started into
    memory its predecessor still holds fails with a CUDA OOM that has nothing to do with its
    configuration. Returns ``{pid: used_memory}`` still held after ``timeout_s`` (empty when
    released, when ``pids`` is empty, or when the host has no ``nvidia-smi``).
    """
    wanted = sorted(set(pids))
    if not wanted:
        return {}
    ticks = max(0, round(timeout_s / POLL_S))
    res = shell.run(
        script(_GPU_WAIT, " ".join(map(str, wanted)), ticks), timeout_s=timeout_s + 60.0
    )
    out = res.stdout.strip()
    if not out.startswith("held "):
        return {}
    held: dict[int, str] = {}
    for item in out[5:].split(";"):
        pid, _, mem = item.partition("=")
        if pid.strip().isdigit():
            held[int(pid)] = mem.strip()
    return held


_READ = r"""
f=$1; off=$2; lim=$3; fromend=$4
[ -f "$f" ] || { echo missing; exit 0; }
size=$(wc -c < "$f")
if [ "$fromend" = 1 ] && [ $((size - lim)) -gt "$off" ]; then off=$((size - lim)); fi
echo "$off"
tail -c +$((off + 1)) "$f" | head -c "$lim" | base64
"""


def read_file(
    shell: Shell, path: str, *, offset: int = 0, limit: int = 1 << 20, from_end: bool = False
) -> tuple[int, bytes]:
    """Bytes of a host file from ``offset`` (at most ``limit``; with ``from_end`` the last
    ``limit`` bytes after ``offset``) and the position they start at.

    Base64 on the wire: logs hold partial UTF-8 sequences and progress-bar control bytes,
    and byte offsets must stay exact. A missing file reads as empty at ``offset``.
    """
    res = shell.run(script(_READ, path, max(0, offset), limit, int(from_end)))
    head, _, body = res.stdout.partition("\n")
    head = head.strip()
    if not head.isdigit():
        return offset, b""
    try:
        data = base64.b64decode("".join(body.split()), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    return int(head), data
