"""Services as detached processes on a host (no systemd): ``nohup setsid``, pidfile, log.

Files, all in ``run_dir`` on the host (mode 0700; the files are created under umask 077):

* ``NAME.env`` (0600): the service's environment, ``unset X`` / ``export A='...'`` lines
  that the launch sources before running the command. Values never travel on a command
  line, so ``ps`` and ``/proc/PID/cmdline`` on the host show none of them (a secret flag
  such as ``--api-key X`` is the server's own argv and stays visible there: prefer a
  variable for credentials).
* ``NAME.pid``: the pid of the service's session leader (a small ``sh`` that sources the
  environment file, runs the command and appends ``=== autotune: exited with code N`` to
  the log when it ends on its own). The leader writes it itself, so it is right whether or
  not ``setsid`` had to fork. Its pid is also the process group and session id of
  everything the service forks.
* ``NAME.json`` (0600): what was started (command, argv and environment with secrets
  redacted), the leader's start time in clock ticks (``/proc/PID/stat`` field 22, so a
  recycled pid is never mistaken for the service), the log offset of the start, and after
  a stop the pids the group had (their GPU memory is waited for before the next start).
* ``NAME.log`` (0600: servers print their arguments, credentials included): appended; one
  ``=== autotune: start ...`` header per start (secrets redacted) and one
  ``=== autotune: stopped`` line.

The command line is built from ``shlex.quote`` d words only and reaches the service through
``"$@"``: a value is never parsed by a shell, whatever it contains. The environment file is
made of ``shlex.quote`` d values too, so sourcing it assigns them literally. The service
itself runs with the umask the host's shell had, not autotune's 077.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from autotune.errors import ConfigError, LaunchError
from autotune.failures import Failure
from autotune.remote.managers import hostops
from autotune.remote.managers.base import ShellManager, last_lines, lines_after
from autotune.remote.shell import Shell
from autotune.secrets import redact_argv, redact_env, redacted_command
from autotune.specs import ServiceSpec, scratch_name

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXITED = re.compile(r"^=== autotune: exited with code (-?\d+)$", re.MULTILINE)
_READ_LIMIT = 1 << 20
_TAIL_BYTES = 256 * 1024

_START = r"""
run=$1; log=$2; pidf=$3; header=$4; workdir=$5; check=$6; envf=$7; scratch=$8; shift 8
mask=$(umask)
umask 077
mkdir -p "$run" || exit 1
printf '%s\n' "$header" >> "$log" || exit 1
chmod 600 "$log" 2>/dev/null
off=$(wc -c < "$log")
rm -f "$pidf"
if [ -n "$workdir" ]; then
  if ! cd "$workdir" 2>/dev/null; then
    echo "=== autotune: no directory $workdir" >> "$log"; echo nodir; exit 0
  fi
fi
if [ -n "$check" ]; then
  case "$check" in
    */*) [ -f "$check" ] && [ -x "$check" ] ;;
    *) command -v "$check" >/dev/null 2>&1 ;;
  esac || { echo "=== autotune: executable not found: $check" >> "$log"; echo noexe; exit 0; }
fi
if [ -n "$scratch" ]; then
  scratch="${TMPDIR:-/tmp}/$scratch"
  rm -rf "$scratch"
  mkdir -m 700 "$scratch" 2>/dev/null || {
    echo "=== autotune: cannot make the scratch directory $scratch" >> "$log"
    echo "noscratch $scratch"; exit 0; }
  AUTOTUNE_SCRATCH=$scratch; export AUTOTUNE_SCRATCH
fi
leader='echo "$$" > "$1"; umask "$2"; . "$3" || exit 126; shift 3; "$@"; rc=$?
echo "=== autotune: exited with code $rc"; exit $rc'
nohup setsid sh -c "$leader" autotune-service "$pidf" "$mask" "$envf" "$@" \
  >> "$log" 2>&1 < /dev/null &
i=0
while [ ! -s "$pidf" ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
pid=$(cat "$pidf" 2>/dev/null)
[ -n "$pid" ] || { echo nopid; exit 0; }
echo "started $off $pid"
sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null || echo nostat
"""

_STATUS = r"""
pidf=$1; meta=$2
pid=$(cat "$pidf" 2>/dev/null)
echo "pid $pid"
case "$pid" in
  ''|*[!0-9]*) ;;
  *)
    if [ -r "/proc/$pid/stat" ]; then echo "stat $(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null)"
    elif kill -0 "$pid" 2>/dev/null; then echo "stat nostat"
    fi ;;
esac
if [ -f "$meta" ]; then printf 'meta '; tr -d '\n' < "$meta"; echo; fi
"""

_AFTER_STOP = r"""
log=$1; pidf=$2; line=$3; scratch=$4
printf '%s\n' "$line" >> "$log" 2>/dev/null
rm -f "$pidf"
[ -z "$scratch" ] || rm -rf "${TMPDIR:-/tmp}/$scratch"
"""

_LIST = r"""
cd "$1" 2>/dev/null || exit 0
for f in *.pid; do [ -e "$f" ] && printf '%s\n' "${f%.pid}"; done
"""


@dataclass(frozen=True)
class _Status:
    pid: int | None
    proc: hostops.ProcInfo | None
    meta: dict[str, Any] | None

    def ours(self) -> bool:
        """The pidfile's process is the one we started (no recycled pid)."""
        if self.proc is None:
            return True
        want = (self.meta or {}).get("start_ticks")
        return want is None or self.proc.start_ticks is None or self.proc.start_ticks == want

    def alive(self) -> bool:
        return self.proc is not None and self.proc.running and self.ours()


class ProcessManager(ShellManager):
    """Runs services as detached process groups on a host (see the module docstring).

    ``stop_grace_s`` is the grace period a :meth:`start` gives a still-running previous
    instance.
    """

    kind = "process"

    def __init__(
        self,
        *,
        shell: Shell,
        deployment: str,
        run_dir: str | None = None,
        port_wait_s: float = 10.0,
        gpu_wait_s: float = 30.0,
        stop_grace_s: float = 10.0,
    ) -> None:
        super().__init__(
            shell=shell,
            deployment=deployment,
            run_dir=run_dir,
            port_wait_s=port_wait_s,
            gpu_wait_s=gpu_wait_s,
        )
        self.stop_grace_s = stop_grace_s
        self._meta: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ paths
    def pidfile(self, name: str) -> str:
        return posixpath.join(self.run_dir, f"{name}.pid")

    def metafile(self, name: str) -> str:
        return posixpath.join(self.run_dir, f"{name}.json")

    def envfile(self, name: str) -> str:
        """The service's environment on the host (0600), sourced at each start."""
        return posixpath.join(self.run_dir, f"{name}.env")

    def logfile(self, name: str) -> str:
        """The service's log on the host (``spec.log_file`` is the tuner machine's path)."""
        return posixpath.join(self.run_dir, f"{name}.log")

    # ------------------------------------------------------------------ contract
    def start(self, spec: ServiceSpec) -> None:
        name = self._name_of(spec)
        if not spec.argv:
            raise ConfigError(f"service '{name}' has an empty argv", field=f"services.{name}.argv")
        run = self._ensure_run_dir()
        status = self._status(name)
        if status.pid is not None:
            # Running, or crashed with members of its group possibly still holding the port
            # and GPU memory: stop (a no-op for whatever is gone) before starting again.
            self.stop(name, grace_s=self.stop_grace_s)
            status = self._status(name)
        old_pids = [int(p) for p in (status.meta or {}).get("stopped_pids", [])]
        self._wait_resources(spec, old_pids=old_pids)

        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        shown = redacted_command(spec.argv, spec.env, spec.unset_env)
        header = f"=== autotune: start {name} at {started_at} on {self.shell.name}: {shown}"
        envf = self.envfile(name)
        self.shell.put_text(envf, env_file_text(spec), mode=0o600)
        check = "" if "PATH" in spec.env else spec.argv[0]
        log = self.logfile(name)
        res = self.shell.run(
            hostops.script(
                _START,
                run,
                log,
                self.pidfile(name),
                header,
                spec.workdir or "",
                check,
                envf,
                self._scratch(name) if spec.scratch_env else "",
                *spec.argv,
            )
        )
        lines = res.stdout.splitlines()
        first = lines[0].split() if lines else []
        if not first or first[0] != "started":
            self._fail_start(spec, first[0] if first else "", res.stderr)
        offset, pid = int(first[1]), int(first[2])
        proc = hostops.parse_stat(pid, lines[1] if len(lines) > 1 else "")
        meta: dict[str, Any] = {
            "name": name,
            "pid": pid,
            "pgid": pid,
            "start_ticks": proc.start_ticks if proc is not None else None,
            "fingerprint": spec.fingerprint(),
            "command": shown,
            "argv": redact_argv(spec.argv),
            "env": redact_env(spec.env),
            "unset_env": list(spec.unset_env),
            "host": spec.host,
            "port": spec.port,
            "log_file": log,
            "log_offset": offset,
            "started_at": started_at,
            "state": "running",
            "stopped_pids": [],
        }
        self._write_meta(name, meta)

    def stop(self, spec_or_name: ServiceSpec | str, *, grace_s: float = 10.0) -> None:
        name = self._name_of(spec_or_name)
        status = self._status(name)
        meta = dict(status.meta or {})
        pid = status.pid if status.pid is not None else meta.get("pid")
        if pid is None or meta.get("state") == "stopped" and status.pid is None:
            return
        members: list[int] = []
        stuck: list[int] = []
        killed = False
        if status.ours():
            pgid = int(meta.get("pgid", pid))
            result = hostops.terminate_group(self.shell, pgid, grace_s=grace_s)
            members, stuck, killed = result.members, result.stuck, result.killed
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        how = "SIGKILL after grace" if killed else "SIGTERM"
        line = (
            f"=== autotune: stopped {name} at {when} ({how})"
            if members
            else f"=== autotune: {name} was not running at {when}"
        )
        # The scratch directory goes with the processes that use it, never from under one.
        scratch = "" if stuck else self._scratch(name)
        self.shell.run(
            hostops.script(_AFTER_STOP, self.logfile(name), self.pidfile(name), line, scratch)
        )
        if meta:
            meta.update(state="stopped", stopped_at=when, stopped_pids=members)
            self._write_meta(name, meta)
        if stuck:
            raise LaunchError(
                f"processes {stuck} of the service did not exit after SIGKILL on "
                f"{self.shell.name} (uninterruptible sleep?)",
                service=name,
                failure=Failure.unknown.value,
            )

    def alive(self, name: str) -> bool:
        return self._status(self._name_of(name)).alive()

    def log_tail(self, name: str, *, lines: int = 80) -> str:
        name = self._name_of(name)
        start = self._start_offset(name)
        _, data = hostops.read_file(
            self.shell, self.logfile(name), offset=start, limit=_TAIL_BYTES, from_end=True
        )
        return last_lines(data.decode(errors="replace"), lines)

    def log_since(self, name: str, offset: int) -> tuple[str, int]:
        """Byte offsets into ``NAME.log``; only complete lines are returned."""
        name = self._name_of(name)
        pos = max(offset, self._start_offset(name))
        pos, data = hostops.read_file(self.shell, self.logfile(name), offset=pos, limit=_READ_LIMIT)
        text, used = lines_after(data, complete_only=len(data) < _READ_LIMIT)
        return text, pos + used

    def exit_code(self, name: str) -> int | None:
        """The code the leader wrote to the log when the command ended on its own."""
        codes = _EXITED.findall(self.log_tail(name, lines=5))
        return int(codes[-1]) if codes else None

    def log_location(self, name: str) -> str:
        return f"{self.shell.name}:{self.logfile(self._name_of(name))}"

    def restore(self, name: str) -> None:
        """Stop the service and remove its pidfile and record; the log is kept."""
        name = self._name_of(name)
        self.stop(name)
        files = (self.pidfile(name), self.metafile(name), self.envfile(name))
        self.shell.run("rm -f " + " ".join(shlex.quote(f) for f in files))
        self._meta.pop(name, None)

    def inventory(self) -> dict[str, Any]:
        """Services with a pidfile on the host: pid, whether it runs, command, log."""
        res = self.shell.run(hostops.script(_LIST, self.run_dir))
        services: dict[str, Any] = {}
        for name in res.stdout.split():
            status = self._status(name)
            meta = status.meta or {}
            services[name] = {
                "pid": status.pid,
                "alive": status.alive(),
                "command": meta.get("command"),
                "started_at": meta.get("started_at"),
                "log_file": meta.get("log_file", self.logfile(name)),
                "port": meta.get("port"),
            }
        return {
            "manager": self.kind,
            "host": self.shell.name,
            "run_dir": self.run_dir,
            "services": services,
        }

    # ------------------------------------------------------------------ helpers
    def _status(self, name: str) -> _Status:
        res = self.shell.run(hostops.script(_STATUS, self.pidfile(name), self.metafile(name)))
        pid: int | None = None
        proc: hostops.ProcInfo | None = None
        meta: dict[str, Any] | None = None
        for line in res.stdout.splitlines():
            key, _, rest = line.partition(" ")
            if key == "pid" and rest.strip().isdigit():
                pid = int(rest)
            elif key == "stat" and pid is not None:
                proc = hostops.parse_stat(pid, rest)
            elif key == "meta":
                with contextlib.suppress(ValueError):
                    loaded = json.loads(rest)
                    meta = loaded if isinstance(loaded, dict) else None
        if meta is not None:
            self._meta[name] = meta
        return _Status(pid=pid, proc=proc, meta=meta)

    def _start_offset(self, name: str) -> int:
        meta = self._meta.get(name)
        if meta is None:
            meta = self._status(name).meta or {}
        return int(meta.get("log_offset", 0))

    def _write_meta(self, name: str, meta: dict[str, Any]) -> None:
        text = json.dumps(meta, sort_keys=True) + "\n"
        self.shell.put_text(self.metafile(name), text, mode=0o600)
        self._meta[name] = meta

    def _scratch(self, name: str) -> str:
        """The name of the service's scratch directory in the host's temp directory."""
        return scratch_name(self.run_dir, name)

    def _fail_start(self, spec: ServiceSpec, what: str, stderr: str) -> None:
        name = spec.name
        if what == "noscratch":
            raise LaunchError(
                f"cannot make the scratch directory of service '{name}' "
                f"({', '.join(spec.scratch_env)}) in the temp directory of {self.shell.name} "
                f"(its log: {self.log_location(name)})",
                service=name,
                failure=Failure.host_unreachable.value,
            )
        if what == "noexe":
            raise ConfigError(
                f"service '{name}': executable '{spec.argv[0]}' not found on host "
                f"{self.shell.name}",
                field=f"services.{name}.argv[0]",
            )
        if what == "nodir":
            raise ConfigError(
                f"service '{name}': working directory '{spec.workdir}' does not exist on "
                f"host {self.shell.name}",
                field=f"services.{name}.workdir",
            )
        detail = stderr.strip()[-500:] or "no pidfile appeared"
        raise LaunchError(
            f"could not launch on {self.shell.name}: {detail}",
            service=name,
            failure=Failure.exited.value,
            log_tail=self.log_tail(name),
        )


def env_file_text(spec: ServiceSpec) -> str:
    """The ``NAME.env`` text: ``unset X`` then ``export A='value'`` per variable (values
    ``shlex.quote`` d, so spaces, quotes, ``$`` and newlines are assigned literally)."""
    lines = [f"# autotune: environment of service {spec.name}; sourced at its start"]
    for var in sorted(set(spec.unset_env)):
        lines.append(f"unset {_env_name(var, service=spec.name)}")
    for var, value in sorted(spec.env.items()):
        lines.append(f"export {_env_name(var, service=spec.name)}={shlex.quote(value)}")
    for var in sorted(set(spec.scratch_env)):  # the host's own value first, as locally
        name = _env_name(var, service=spec.name)
        lines.append(f'export {name}="${{{name}:-$AUTOTUNE_SCRATCH}}"')
    return "\n".join(lines) + "\n"


def _env_name(name: str, *, service: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(
            f"service '{service}': '{name}' is not a valid environment variable name",
            field=f"services.{service}.env",
        )
    return name
