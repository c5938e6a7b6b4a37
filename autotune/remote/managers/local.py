"""Services as child processes of the tuner on this machine (prefill + decode + router on
one host's GPUs).

Each service runs in its own process group so a stop reaches the worker processes SGLang
forks (schedulers, detokenizer) that hold GPU memory: SIGTERM to the group, SIGKILL after a
grace period, then wait until no member is left. A process group, not a session of its own:
where the kernel groups tasks by session for scheduling (``sched_autogroup_enabled``, on by
default in most distributions), a service in a new session is a scheduling group apart from
the tuner, and a busy engine then held the load generator off both cores for hundreds of
milliseconds at a time (a real vLLM on 2 cores: p99 send lag 60-750 ms at 16-128 req/s
from a new session against 0.8-8 ms from the tuner's own, the same search otherwise;
BENCHMARKS.md, "Does the open loop keep its schedule?"). Ctrl-C at a terminal still reaches
only the tuner: a service's group is never the foreground one. Output goes to
the service's log file (``spec.log_file``, appended, one header line per start; owner-only,
0600, because servers print their arguments, credentials included). The header and
``state.json`` show the command with its secrets redacted
(:func:`autotune.secrets.redacted_command`); the environment reaches the process directly,
never through a command line. Process ids are recorded in ``RUN_DIR/state.json`` so a later
manager on the same run directory can stop leftovers of a crashed or killed session
(:meth:`LocalManager.stop_leftovers`, which the launcher calls before its first start and
in ``stop_all``). Nothing here needs a shell: every check is a system call, so the launcher
may look at the process and its log on every readiness poll.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.errors import LaunchError
from autotune.failures import Failure
from autotune.ports import wait_port_free
from autotune.remote.managers.base import (
    EventCallback,
    ServiceManager,
    last_lines,
    lines_after,
    port_in_use,
)
from autotune.secrets import redacted_command
from autotune.specs import ServiceSpec, scratch_name

STATE_FILE = "state.json"
RUN_DIR_VAR = "AUTOTUNE_LOCAL_RUN_DIR"
"""Set in every service's environment to its manager's run directory: a tuner killed
between starting a process and recording it in ``state.json`` leaves a process no record
names, and the next manager on that run directory finds it by this variable."""
_TAIL_BYTES = 16384
_SCAN_BYTES = 4 * 1024 * 1024

_OWN_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
)
"""Popen arguments that start a service as the leader of a new process group in the
tuner's session (see the module's docstring for why not ``start_new_session``)."""


@dataclass
class _Proc:
    name: str
    fingerprint: str
    pid: int
    pgid: int
    start_ticks: int | None
    log_file: str
    command: str
    started_at: str
    popen: subprocess.Popen[bytes] | None = None
    log_offset: int = 0
    scratch: str = ""
    """The service's scratch directory (``spec.scratch_env``), removed once it has stopped."""

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "start_ticks": self.start_ticks,
            "fingerprint": self.fingerprint,
            "log_file": self.log_file,
            "command": self.command,
            "started_at": self.started_at,
            "scratch": self.scratch,
        }


class LocalManager(ServiceManager):
    """Runs services as subprocesses of this process, recorded in ``run_dir/state.json``.

    ``port_wait_s`` bounds the wait for a port still held (by the previous instance, or
    anything else: then the start fails with ``port_in_use``); ``stop_grace_s`` is the
    SIGTERM-to-SIGKILL grace for leftovers.
    """

    kind = "local"
    check_interval_s = 0.0

    def __init__(
        self, run_dir: str | Path, *, port_wait_s: float = 10.0, stop_grace_s: float = 10.0
    ) -> None:
        self.run_dir = Path(run_dir)
        self.port_wait_s = port_wait_s
        self.stop_grace_s = stop_grace_s
        self._procs: dict[str, _Proc] = {}
        self._state_lock = threading.RLock()
        self._last: dict[str, _Proc] = {}
        """The last start of every service, stopped ones included (their logs)."""
        self._leftovers: dict[str, _Proc] = _read_state(self.state_file)
        self._last.update(self._leftovers)
        recorded = {p.pid for p in self._leftovers.values()}
        for pid in _marked_processes(self.run_dir):
            if pid not in recorded and pid != os.getpid():
                orphan = _orphan(pid)
                if orphan is not None:
                    self._leftovers[orphan.name] = orphan

    @property
    def where(self) -> str:
        return "this machine"

    @property
    def state_file(self) -> Path:
        return self.run_dir / STATE_FILE

    def pids(self) -> dict[str, int]:
        """Process id (= process group id) per service this manager started."""
        return {name: p.pid for name, p in self._procs.items()}

    # ------------------------------------------------------------------ contract
    def start(self, spec: ServiceSpec) -> None:
        for records in (self._procs, self._leftovers):
            if spec.name in records:
                self.stop(spec.name, grace_s=self.stop_grace_s)
        if not wait_port_free(spec.host, spec.port, timeout_s=self.port_wait_s):
            raise port_in_use(spec, where=self.where, waited_s=self.port_wait_s)
        log_path = Path(spec.log_file)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for key in spec.unset_env:
            env.pop(key, None)
        env.update(spec.env)
        env[RUN_DIR_VAR] = str(self.run_dir.resolve())
        wanted = [var for var in spec.scratch_env if var not in os.environ]  # else: theirs
        scratch = self._fresh_scratch(spec) if wanted else ""
        env.update(dict.fromkeys(wanted, scratch))
        command = redacted_command(spec.argv, spec.env, spec.unset_env)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "ab") as log:
            header = f"\n=== autotune: start {spec.name} at {started_at}: {command}\n"
            log.write(header.encode())
            log.flush()
            offset = log.tell()
            try:
                popen = subprocess.Popen(
                    list(spec.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=spec.workdir,
                    **_OWN_GROUP,
                )
            except OSError as exc:
                log.write(f"=== autotune: cannot start: {exc}\n".encode())
                # A missing or non-executable program (or workdir) is the same for every
                # configuration (levers never edit the program): the run stops with this
                # message instead of failing every trial alike; the trial is retried.
                missing = exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR)
                raise LaunchError(
                    f"cannot start {shlex.join(spec.argv[:1])}: {exc}",
                    service=spec.name,
                    failure=(Failure.host_unreachable if missing else Failure.exited).value,
                ) from None
        proc = _Proc(
            name=spec.name,
            fingerprint=spec.fingerprint(),
            pid=popen.pid,
            pgid=popen.pid,
            start_ticks=_start_ticks(popen.pid),
            log_file=str(log_path),
            command=command,
            started_at=started_at,
            popen=popen,
            log_offset=offset,
            scratch=scratch,
        )
        self._procs[spec.name] = self._last[spec.name] = proc
        self._save_state()

    def stop(self, spec_or_name: ServiceSpec | str, *, grace_s: float = 10.0) -> None:
        name = spec_or_name.name if isinstance(spec_or_name, ServiceSpec) else spec_or_name
        with self._state_lock:  # stops of independent services run in threads
            own = self._procs.pop(name, None)
            p = own or self._leftovers.pop(name, None)
        if p is None:
            return
        try:
            _terminate([p], grace_s=grace_s)
        finally:
            with self._state_lock:
                if _proc_alive(p):
                    self._leftovers[name] = p  # stuck: stop_leftovers tries again
                else:
                    _remove_scratch(p)
                    if own is not None:
                        _log_stop(p)
                self._save_state()

    def alive(self, name: str) -> bool:
        p = self._procs.get(name) or self._leftovers.get(name)
        if p is None:
            return False
        if p.popen is not None:
            return p.popen.poll() is None
        return _proc_alive(p)

    def exit_code(self, name: str) -> int | None:
        p = self._last.get(name)
        return p.popen.poll() if p is not None and p.popen is not None else None

    def log_tail(self, name: str, *, lines: int = 80) -> str:
        p = self._last.get(name)
        if p is None:
            return ""
        text = _read_from(p.log_file, p.log_offset, limit=max(_TAIL_BYTES, 256 * lines))
        return last_lines(text, lines)

    def log_since(self, name: str, offset: int) -> tuple[str, int]:
        """Byte offsets into the log file; only complete lines are returned."""
        p = self._last.get(name)
        if p is None:
            return "", offset
        pos = max(offset, p.log_offset)
        try:
            with open(p.log_file, "rb") as fh:
                fh.seek(pos)
                data = fh.read(_SCAN_BYTES)
        except OSError:
            return "", pos
        text, used = lines_after(data, complete_only=True)
        return text, pos + used

    def log_location(self, name: str) -> str:
        p = self._last.get(name)
        return p.log_file if p is not None else self.where

    def restore(self, name: str) -> None:
        """Stop the service (this session's or a leftover); the log is kept."""
        self.stop(name, grace_s=self.stop_grace_s)

    def inventory(self) -> dict[str, Any]:
        services = {
            name: {
                "pid": p.pid,
                "alive": self.alive(name),
                "command": p.command,
                "started_at": p.started_at,
                "log_file": p.log_file,
            }
            for name, p in {**self._leftovers, **self._procs}.items()
        }
        return {
            "manager": self.kind,
            "host": self.where,
            "run_dir": str(self.run_dir),
            "services": services,
        }

    def stop_leftovers(self, on_event: EventCallback) -> None:
        if not self._leftovers:
            return
        leftovers = [p for p in self._leftovers.values() if _proc_alive(p)]
        for p in leftovers:
            on_event(p.name, "stopping leftover")
        _terminate(leftovers, grace_s=self.stop_grace_s)
        gone = {n for n, p in self._leftovers.items() if not _proc_alive(p)}  # one /proc scan
        for name in gone:
            _remove_scratch(self._leftovers.pop(name))
        self._save_state()

    def detach(self) -> None:
        # The processes run in their own sessions and are recorded in state.json, so they
        # outlive the tuner and a later manager (``autotune restore``) can stop them.
        self._procs.clear()

    # ------------------------------------------------------------------ helpers
    def _fresh_scratch(self, spec: ServiceSpec) -> str:
        """An empty directory of the service's own (owner-only) for ``spec.scratch_env``, in
        the system temp directory, not the run directory: the engine puts Unix sockets there
        (:func:`~autotune.specs.scratch_name`)."""
        path = Path(tempfile.gettempdir()) / scratch_name(str(self.run_dir.resolve()), spec.name)
        shutil.rmtree(path, ignore_errors=True)
        try:
            path.mkdir(mode=0o700)
        except OSError as exc:  # another user's, or the temp directory unwritable
            raise LaunchError(
                f"cannot make the scratch directory {path} ({', '.join(spec.scratch_env)}): {exc}",
                service=spec.name,
                failure=Failure.host_unreachable.value,
            ) from None
        return str(path)

    def _save_state(self) -> None:
        # The launcher stops independent services concurrently (threads): one writer at a
        # time, each with a file of its own until the rename.
        with self._state_lock:
            services = {n: p.to_json() for n, p in self._leftovers.items()}
            services.update({n: p.to_json() for n, p in self._procs.items()})
            path = self.state_file
            if not services:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            data = {"launcher_pid": os.getpid(), "services": services}
            tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, path)


# --------------------------------------------------------------------- processes
def _read_state(path: Path) -> dict[str, _Proc]:
    try:
        data = json.loads(path.read_text())
        services = data["services"]
        return {
            name: _Proc(
                name=name,
                fingerprint=str(s.get("fingerprint", "")),
                pid=int(s["pid"]),
                pgid=int(s.get("pgid", s["pid"])),
                start_ticks=s.get("start_ticks"),
                log_file=str(s.get("log_file", "")),
                command=str(s.get("command", "")),
                started_at=str(s.get("started_at", "")),
                scratch=str(s.get("scratch", "")),
            )
            for name, s in services.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _marked_processes(run_dir: Path) -> list[int]:
    """Process-group leaders (Linux) whose environment names ``run_dir`` as their manager's
    (:data:`RUN_DIR_VAR`); their children inherit it too, and go with their group."""
    if not sys.platform.startswith("linux"):
        return []
    needle = f"{RUN_DIR_VAR}={run_dir.resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = (entry / "environ").read_bytes()
            if needle in environ.split(b"\0") and os.getpgid(pid) == pid:
                found.append(pid)
        except (OSError, ProcessLookupError):
            continue  # gone, or another user's
    return found


def _orphan(pid: int) -> _Proc | None:
    """A process of an earlier session that was never recorded, as a leftover to stop."""
    ticks = _start_ticks(pid)
    if ticks is None:
        return None
    return _Proc(
        name=f"unrecorded-{pid}",
        fingerprint="",
        pid=pid,
        pgid=pid,
        start_ticks=ticks,
        log_file="",
        command="",
        started_at="",
    )


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in process group ``pgid``."""
    if not sys.platform.startswith("linux"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def _is_ours(p: _Proc) -> bool:
    """False when the recorded leader pid now belongs to a different process."""
    if p.popen is not None or p.start_ticks is None:
        return True
    ticks = _start_ticks(p.pid)
    return ticks is None or ticks == p.start_ticks


def _proc_alive(p: _Proc) -> bool:
    """The leader runs, or any member of its group does (children hold ports and GPUs)."""
    if p.popen is not None and p.popen.poll() is None:
        return True
    return _is_ours(p) and _group_alive(p.pgid)


def _signal_group(p: _Proc, sig: signal.Signals) -> None:
    if not _is_ours(p):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pgid, sig)


def _terminate(procs: Sequence[_Proc], *, grace_s: float) -> None:
    """SIGTERM every group, SIGKILL what is left after ``grace_s``, wait until gone."""
    if not procs:
        return
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    if not _wait_gone(procs, timeout_s=grace_s):
        for p in procs:
            if _proc_alive(p):
                _signal_group(p, signal.SIGKILL)
        _wait_gone(procs, timeout_s=10.0)


def _wait_gone(procs: Sequence[_Proc], *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not any(_proc_alive(p) for p in procs):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _remove_scratch(p: _Proc) -> None:
    if p.scratch:
        shutil.rmtree(p.scratch, ignore_errors=True)


# --------------------------------------------------------------------- logs
def _log_stop(p: _Proc) -> None:
    code = p.popen.returncode if p.popen is not None else None
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with contextlib.suppress(OSError), open(p.log_file, "ab") as log:
        log.write(f"=== autotune: stopped {p.name} at {when} (exit code {code})\n".encode())


def _read_from(path: str, offset: int, limit: int) -> str:
    """The log since ``offset`` (at most the last ``limit`` bytes of it)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(offset, size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
