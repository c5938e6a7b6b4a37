"""Services as local processes (one host, e.g. prefill + decode + router on 8 GPUs).

Each service runs in its own process group (``start_new_session``) so a stop reaches the
worker processes SGLang forks (schedulers, detokenizer) that hold GPU memory: SIGTERM to
the group, SIGKILL after a grace period, then wait until no member is left. Output goes to
the service's log file (appended, one header line per start; owner-only, 0600, because
servers print their arguments, credentials included). The header and ``state.json`` show
the command with its secrets redacted (:func:`autotune.secrets.redacted_command`); the
environment reaches the process directly, never through a command line. Process ids are
recorded in ``RUN_DIR/state.json`` so a later launcher on the same run directory can stop
leftovers of a crashed or killed session (``stop_all`` on a fresh launcher, or
automatically before its first start).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.errors import LaunchError
from autotune.launch.base import EventCallback, Launcher, RunningState
from autotune.launch.classify import (
    FATAL_WHILE_ALIVE,
    FailureClass,
    classify_line,
    classify_log,
)
from autotune.launch.health import HealthProber
from autotune.launch.ports import wait_port_free
from autotune.secrets import redacted_command
from autotune.specs import ServiceSpec

STATE_FILE = "state.json"
_TAIL_LINES = 60
_TAIL_BYTES = 16384


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
    started_mono: float = 0.0
    log_offset: int = 0
    scan_offset: int = 0
    ready: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "start_ticks": self.start_ticks,
            "fingerprint": self.fingerprint,
            "log_file": self.log_file,
            "command": self.command,
            "started_at": self.started_at,
            "ready": self.ready,
        }


class LocalLauncher(Launcher):
    """Runs :class:`ServiceSpec` s as local subprocesses.

    ``run_dir`` holds ``state.json``; ``stop_grace_s`` is the SIGTERM-to-SIGKILL grace;
    ``port_wait_s`` bounds the wait for a port still held (by the previous instance, or
    anything else: then the start fails with ``port_in_use``); ``fatal_while_alive`` are
    the log classes that fail a start even though the process has not exited.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        stop_grace_s: float = 10.0,
        port_wait_s: float = 10.0,
        poll_interval_s: float = 0.1,
        probe_timeout_s: float = 2.0,
        fatal_while_alive: Iterable[FailureClass] = FATAL_WHILE_ALIVE,
    ) -> None:
        super().__init__(poll_interval_s=poll_interval_s)
        self.run_dir = Path(run_dir)
        self.stop_grace_s = stop_grace_s
        self.port_wait_s = port_wait_s
        self.fatal_while_alive = frozenset(fatal_while_alive)
        self._prober = HealthProber(connect_timeout_s=0.5, read_timeout_s=probe_timeout_s)
        self._procs: dict[str, _Proc] = {}
        self._leftovers: dict[str, _Proc] = _read_state(self.state_file)

    @property
    def state_file(self) -> Path:
        return self.run_dir / STATE_FILE

    def pids(self) -> dict[str, int]:
        """Process id (= process group id) per running service."""
        return {name: p.pid for name, p in self._procs.items()}

    # ----------------------------------------------------------------- primitives
    def _prepare(self, on_event: EventCallback) -> None:
        if self._leftovers:
            self._kill_leftovers(on_event)

    def _current(self) -> dict[str, RunningState]:
        return {
            name: RunningState(p.fingerprint, alive=_proc_alive(p), ready=p.ready)
            for name, p in self._procs.items()
        }

    def _stop(self, names: Sequence[str], on_event: EventCallback) -> None:
        procs = [self._procs[n] for n in names if n in self._procs]
        for p in procs:
            on_event(p.name, "stopping")
        try:
            _terminate(procs, grace_s=self.stop_grace_s)
        finally:
            for p in procs:
                if not _proc_alive(p):
                    self._procs.pop(p.name, None)
                    _log_stop(p)
            self._save_state()
        for p in procs:
            on_event(p.name, "stopped")

    def _start(self, spec: ServiceSpec) -> None:
        if not wait_port_free(spec.host, spec.port, timeout_s=self.port_wait_s):
            raise LaunchError(
                f"port {spec.host}:{spec.port} is in use by another process "
                f"(still taken after {self.port_wait_s:g} s; "
                f"see `ss -ltnp 'sport = :{spec.port}'`)",
                service=spec.name,
                failure=FailureClass.port_in_use.value,
            )
        log_path = Path(spec.log_file)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for key in spec.unset_env:
            env.pop(key, None)
        env.update(spec.env)
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
                    start_new_session=True,
                )
            except OSError as exc:
                log.write(f"=== autotune: cannot start: {exc}\n".encode())
                raise LaunchError(
                    f"cannot start {shlex.join(spec.argv[:1])}: {exc}",
                    service=spec.name,
                    failure=FailureClass.exited.value,
                ) from None
        self._procs[spec.name] = _Proc(
            name=spec.name,
            fingerprint=spec.fingerprint(),
            pid=popen.pid,
            pgid=popen.pid,
            start_ticks=_start_ticks(popen.pid),
            log_file=str(log_path),
            command=command,
            started_at=started_at,
            popen=popen,
            started_mono=time.monotonic(),
            log_offset=offset,
            scan_offset=offset,
        )
        self._save_state()

    def _poll_ready(self, spec: ServiceSpec) -> bool:
        p = self._procs[spec.name]
        if p.ready:
            return True
        rc = p.popen.poll() if p.popen is not None else None
        if rc is not None:
            self._fail(p, rc=rc)
        fatal = self._scan_log(p)
        if fatal:
            self._fail(p, rc=None)
        if self._prober.probe(spec.health_url).ok:
            p.ready = True
            self._save_state()
            return True
        if time.monotonic() - p.started_mono > spec.ready_timeout_s:
            last = self._prober.probe(spec.health_url)
            tail = _log_tail(p)
            self._stop([p.name], _noop)
            raise LaunchError(
                f"not healthy after {spec.ready_timeout_s:g} s "
                f"({spec.health_url}: {last.status_code or last.detail})",
                service=p.name,
                failure=FailureClass.readiness_timeout.value,
                log_tail=tail,
            )
        return False

    def _fetch_info(self, spec: ServiceSpec) -> dict[str, Any] | None:
        return self._prober.fetch_json(spec.info_url) if spec.info_url else None

    def log_tails(self, specs: Mapping[str, ServiceSpec], *, lines: int = 40) -> str:
        parts = []
        for name, spec in specs.items():
            p = self._procs.get(name)
            offset = p.log_offset if p is not None else 0
            text = _read_from(spec.log_file, offset, limit=max(_TAIL_BYTES, 256 * lines))
            tail = "\n".join(text.splitlines()[-lines:])
            if tail:
                parts.append(f"--- {name} ({spec.log_file})\n{tail}")
        return "\n".join(parts)

    def stop_all(self) -> None:
        if self._procs:
            self._stop(list(reversed(self._procs)), _noop)
        if self._leftovers:
            self._kill_leftovers(_noop)
        self._info.clear()

    def close(self) -> None:
        try:
            self.stop_all()
        finally:
            self._prober.close()

    def detach(self) -> None:
        # The processes run in their own sessions and are recorded in state.json, so they
        # outlive the tuner and a later `autotune restore` (stop_all) can stop them.
        self._procs.clear()
        self._prober.close()

    # ----------------------------------------------------------------- helpers
    def _fail(self, p: _Proc, *, rc: int | None) -> None:
        """Stop ``p``, classify its log since the start, raise LaunchError."""
        if rc is None:
            self._stop([p.name], _noop)
        text = _read_from(p.log_file, p.log_offset)
        found = classify_log(text)
        tail = _tail_text(text)
        if rc is not None:
            # Children may outlive the leader; they hold GPU memory and ports.
            self._stop([p.name], _noop)
            failure = found.failure
            if failure == FailureClass.unknown:
                failure = FailureClass.exited
            reason = f"exited with code {rc}" + (f": {found.line}" if found.line else "")
        else:
            failure = found.failure
            reason = f"fatal error while starting (stopped): {found.line}"
        raise LaunchError(reason, service=p.name, failure=failure.value, log_tail=tail)

    def _scan_log(self, p: _Proc) -> bool:
        """Read new complete log lines; True when one is fatal even with the process alive."""
        try:
            with open(p.log_file, "rb") as fh:
                fh.seek(p.scan_offset)
                chunk = fh.read(4 * 1024 * 1024)
        except OSError:
            return False
        end = chunk.rfind(b"\n")
        if end < 0:
            return False
        p.scan_offset += end + 1
        for line in chunk[: end + 1].decode(errors="replace").splitlines():
            hit = classify_line(line)
            if hit is not None and hit[1] in self.fatal_while_alive:
                return True
        return False

    def _kill_leftovers(self, on_event: EventCallback) -> None:
        leftovers = [p for p in self._leftovers.values() if _proc_alive(p)]
        for p in leftovers:
            on_event(p.name, "stopping leftover")
        _terminate(leftovers, grace_s=self.stop_grace_s)
        self._leftovers = {n: p for n, p in self._leftovers.items() if _proc_alive(p)}
        self._save_state()

    def _save_state(self) -> None:
        services = {n: p.to_json() for n, p in self._leftovers.items()}
        services.update({n: p.to_json() for n, p in self._procs.items()})
        path = self.state_file
        if not services:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        data = {"launcher_pid": os.getpid(), "services": services}
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


def _noop(service: str, event: str) -> None:
    return None


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


# --------------------------------------------------------------------- logs
def _log_stop(p: _Proc) -> None:
    code = p.popen.returncode if p.popen is not None else None
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with contextlib.suppress(OSError), open(p.log_file, "ab") as log:
        log.write(f"=== autotune: stopped {p.name} at {when} (exit code {code})\n".encode())


def _read_from(path: str, offset: int, limit: int = 8 * 1024 * 1024) -> str:
    """The log since ``offset`` (at most the last ``limit`` bytes of it)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(offset, size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _tail_text(text: str) -> str:
    lines = text[-_TAIL_BYTES:].splitlines()
    return "\n".join(lines[-_TAIL_LINES:])


def _log_tail(p: _Proc) -> str:
    return _tail_text(_read_from(p.log_file, p.log_offset, limit=_TAIL_BYTES))
