"""Services that are systemd units on a host: autotune overrides them with a drop-in.

A start writes ``UNIT_DIR/UNIT.d/50-autotune.conf`` (:mod:`autotune.remote.dropin`), runs
``systemctl daemon-reload``, stops the unit if it runs (``stop --no-block``, SIGKILL after the
grace period), waits until the port is free and the old processes' GPU memory is released,
and ``systemctl start`` s it. Readiness is the launcher's (health URL).

Before the **first** change to a unit its pre-tuning state is recorded on the host in
``run_dir/state.json`` (mode 0600: it may hold a previous drop-in's secrets): whether it was
active, and the previous ``50-autotune.conf`` (content and mode) if there was one. A later
session finds that record and keeps it, so ``restore`` always returns to the state before
tuning: the drop-in removed (or the previous one put back), ``daemon-reload``, and the unit
restarted if it was active, stopped if it was not.

Logs come from the journal, limited to the unit's current **invocation**
(``_SYSTEMD_INVOCATION_ID``, read after the start; systemd >= 232), so lines of an earlier
run never classify this one. :meth:`SystemdManager.log_since` offsets are **line counts**
within that invocation (a journal cursor is not an ``int``); each call re-reads the
invocation's lines, which is cheap during start-up, when the launcher scans. Privileged
commands (``systemctl`` changes, drop-in writes, ``journalctl``) run with ``sudo=True``;
the shell decides whether that means ``sudo -n``.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import shlex
import threading
from datetime import datetime, timezone
from typing import Any

from autotune.errors import ConfigError, LaunchError
from autotune.failures import Failure
from autotune.remote.dropin import dropin_mode, dropin_path, normalize_unit, render_dropin
from autotune.remote.managers import hostops
from autotune.remote.managers.base import ShellManager, last_lines
from autotune.remote.shell import CommandResult, Shell
from autotune.secrets import redacted_command
from autotune.specs import ServiceSpec

STATE_FILE = "state.json"
ACTIVE_STATES = frozenset({"active", "activating", "reloading"})
_PROPS = ("LoadState", "ActiveState", "MainPID", "InvocationID")

_RESOLVE = r"""
a=$1
case "$a" in
  /*) [ -f "$a" ] && [ -x "$a" ] && printf '%s\n' "$a" ;;
  *) command -v "$a" ;;
esac
exit 0
"""

_READ_DROPIN = r"""
f=$1
[ -f "$f" ] || exit 0
echo "mode $(stat -c %a "$f" 2>/dev/null || echo 644)"
cat "$f"
"""

_STOP = r"""
unit=$1; grace=$2
busy() {
  case "$(systemctl is-active "$unit" 2>/dev/null)" in
    active|activating|deactivating|reloading) return 0 ;;
  esac
  return 1
}
busy || { echo inactive; exit 0; }
systemctl stop --no-block "$unit" || exit 1
i=0
while busy && [ "$i" -lt "$grace" ]; do sleep 0.1; i=$((i + 1)); done
if busy; then
  systemctl kill --signal=SIGKILL "$unit"
  echo killed
  i=0
  while busy && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
fi
if busy; then echo stuck; else echo stopped; fi
"""

_REMOVE_DROPIN = r"""
f=$1; d=$(dirname "$f")
rm -f "$f" && { rmdir "$d" 2>/dev/null; true; }
"""


class SystemdManager(ShellManager):
    """Runs services as existing systemd units overridden by an autotune drop-in.

    ``unit_dir`` is where drop-ins go (``/etc/systemd/system``; a temporary directory in
    tests). ``sudo`` is passed to the shell for privileged commands (set False where the
    unit directory and ``systemctl`` need no privileges, e.g. tests).
    """

    kind = "systemd"

    def __init__(
        self,
        *,
        shell: Shell,
        deployment: str,
        run_dir: str | None = None,
        unit_dir: str = "/etc/systemd/system",
        port_wait_s: float = 10.0,
        gpu_wait_s: float = 30.0,
        stop_grace_s: float = 10.0,
        sudo: bool = True,
    ) -> None:
        super().__init__(
            shell=shell,
            deployment=deployment,
            run_dir=run_dir,
            port_wait_s=port_wait_s,
            gpu_wait_s=gpu_wait_s,
        )
        self.unit_dir = unit_dir
        self.stop_grace_s = stop_grace_s
        self.sudo = sudo
        self._lock = threading.Lock()
        self._units: dict[str, str] = {}
        self._invocations: dict[str, str] = {}

    @property
    def state_file(self) -> str:
        return posixpath.join(self.run_dir, STATE_FILE)

    # ------------------------------------------------------------------ contract
    def start(self, spec: ServiceSpec) -> None:
        name = self._name_of(spec)
        unit = normalize_unit(spec.unit, service=name)
        if not spec.argv:
            raise ConfigError(f"service '{name}' has an empty argv", field=f"services.{name}.argv")
        executable = self._resolve_executable(spec)
        text = render_dropin(spec, executable=executable, deployment=self.deployment, unit=unit)
        path = dropin_path(self.unit_dir, unit)

        props = self._show(unit)
        if props.get("LoadState") != "loaded":
            raise ConfigError(
                f"service '{name}': unit {unit} is not installed on host {self.shell.name} "
                f"(LoadState={props.get('LoadState') or 'unknown'}); autotune overrides an "
                "existing unit, it does not create one",
                field=f"services.{name}.unit",
            )
        self._ensure_run_dir()
        with self._lock:
            state = self._read_state()
            if unit not in state["units"]:
                state["units"][unit] = self._pre_tuning_record(name, unit, path, props)
                self._write_state(state)

        self.shell.put_text(path, text, mode=dropin_mode(spec.env, spec.argv), sudo=self.sudo)
        self._systemctl("daemon-reload", what="systemctl daemon-reload", service=name)
        old_pids: list[int] = []
        if props.get("ActiveState") in ACTIVE_STATES | {"deactivating"}:
            main = _int(props.get("MainPID"))
            if main:
                old_pids = hostops.group_members(self.shell, main)
            self._stop_unit(name, unit, grace_s=self.stop_grace_s)
        self._wait_resources(spec, old_pids=old_pids)

        res = self._systemctl(f"start {shlex.quote(unit)}", what=None, service=name)
        invocation = self._show(unit).get("InvocationID", "")
        with self._lock:
            state = self._read_state()
            state["services"][name] = {
                "unit": unit,
                "invocation_id": invocation,
                "fingerprint": spec.fingerprint(),
                "command": redacted_command(spec.argv, spec.env, spec.unset_env),
                "dropin": path,
                "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            self._write_state(state)
        self._units[name] = unit
        self._invocations[name] = invocation
        if not res.ok:
            raise LaunchError(
                f"systemctl start {unit} failed on {self.shell.name}: "
                f"{(res.stderr or res.stdout).strip()[-500:]}",
                service=name,
                failure=Failure.exited.value,
                log_tail=self.log_tail(name),
            )

    def stop(self, spec_or_name: ServiceSpec | str, *, grace_s: float = 10.0) -> None:
        name = self._name_of(spec_or_name)
        unit: str | None
        if isinstance(spec_or_name, ServiceSpec) and spec_or_name.unit:
            unit = normalize_unit(spec_or_name.unit, service=name)
        else:
            unit = self._unit_of(name)
        if unit is not None:
            self._stop_unit(name, unit, grace_s=grace_s)

    def alive(self, name: str) -> bool:
        """``systemctl is-active`` says active or activating."""
        unit = self._unit_of(self._name_of(name))
        if unit is None:
            return False
        res = self.shell.run(f"systemctl is-active {shlex.quote(unit)}")
        return res.stdout.strip() in ACTIVE_STATES

    def log_tail(self, name: str, *, lines: int = 80) -> str:
        """``journalctl _SYSTEMD_INVOCATION_ID=ID -n N -o cat`` (``-u UNIT`` before any start)."""
        text = self._journal(self._name_of(name), lines=max(lines, 0))
        return last_lines(text, lines)

    def log_since(self, name: str, offset: int) -> tuple[str, int]:
        """Offsets are line counts within the unit's current invocation."""
        lines = self._journal(self._name_of(name), lines=None).splitlines()
        start = min(max(offset, 0), len(lines))
        new = lines[start:]
        return ("\n".join(new) + "\n" if new else ""), len(lines)

    def log_location(self, name: str) -> str:
        unit = self._unit_of(self._name_of(name))
        return f"{self.shell.name}: journalctl -u {unit}" if unit else self.shell.name

    def restore(self, name: str) -> None:
        """Remove the drop-in (or put the previous one back), reload, and return the unit to
        its pre-tuning state: restarted if it was active, stopped if not."""
        name = self._name_of(name)
        with self._lock:
            state = self._read_state()
            unit = (state["services"].get(name) or {}).get("unit")
            if unit is None:
                unit = next(
                    (u for u, rec in state["units"].items() if rec.get("service") == name), None
                )
            record = state["units"].get(unit) if unit else None
            if unit is None or record is None:
                state["services"].pop(name, None)
                self._write_state(state)
                return
            path = str(record.get("dropin_path") or dropin_path(self.unit_dir, unit))
            previous = record.get("previous_dropin")
            if previous is None:
                res = self.shell.run(hostops.script(_REMOVE_DROPIN, path), sudo=self.sudo)
                self._check(res, what=f"removing {path}", service=name)
            else:
                mode = int(str(record.get("previous_mode", "644")), 8)
                self.shell.put_text(path, str(previous), mode=mode, sudo=self.sudo)
            self._systemctl("daemon-reload", what="systemctl daemon-reload", service=name)
            verb = "restart" if record.get("was_active") else "stop"
            self._systemctl(f"{verb} {shlex.quote(unit)}", what=f"systemctl {verb}", service=name)
            state["units"].pop(unit, None)
            for other, svc in list(state["services"].items()):
                if svc.get("unit") == unit:
                    state["services"].pop(other)
            self._write_state(state)
        self._units.pop(name, None)
        self._invocations.pop(name, None)

    def inventory(self) -> dict[str, Any]:
        """Units autotune changed on the host: drop-in, pre-tuning state, current state."""
        state = self._read_state()
        units: dict[str, Any] = {}
        for unit, rec in state["units"].items():
            path = str(rec.get("dropin_path") or dropin_path(self.unit_dir, unit))
            present = self.shell.run(f"test -e {shlex.quote(path)}").ok
            units[unit] = {
                "service": rec.get("service"),
                "dropin": path,
                "dropin_present": present,
                "had_previous_dropin": rec.get("previous_dropin") is not None,
                "was_active": bool(rec.get("was_active")),
                "active_state": self._show(unit).get("ActiveState", "unknown"),
                "recorded_at": rec.get("recorded_at"),
            }
        return {
            "manager": self.kind,
            "host": self.shell.name,
            "run_dir": self.run_dir,
            "unit_dir": self.unit_dir,
            "units": units,
            "services": {
                n: {k: v for k, v in s.items() if k != "command"}
                for n, s in state["services"].items()
            },
        }

    # ------------------------------------------------------------------ helpers
    def _resolve_executable(self, spec: ServiceSpec) -> str:
        """argv[0] as an absolute path on the host (systemd does not search a PATH)."""
        argv0 = spec.argv[0]
        res = self.shell.run(hostops.script(_RESOLVE, argv0))
        found = res.stdout.strip().splitlines()
        if not found or not found[-1].startswith("/"):
            raise ConfigError(
                f"service '{spec.name}': executable '{argv0}' not found on host "
                f"{self.shell.name}; ExecStart= needs an absolute path to an existing program",
                field=f"services.{spec.name}.argv[0]",
            )
        return found[-1]

    def _pre_tuning_record(
        self, name: str, unit: str, path: str, props: dict[str, str]
    ) -> dict[str, Any]:
        res = self.shell.run(hostops.script(_READ_DROPIN, path), sudo=self.sudo)
        previous: str | None = None
        mode = "644"
        if res.ok and res.stdout.startswith("mode "):
            head, _, previous = res.stdout.partition("\n")
            mode = head.split()[1] if len(head.split()) > 1 else "644"
        active = props.get("ActiveState", "")
        return {
            "service": name,
            "dropin_path": path,
            "active_state": active,
            "was_active": active in ACTIVE_STATES,
            "previous_dropin": previous,
            "previous_mode": mode,
            "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def _stop_unit(self, name: str, unit: str, *, grace_s: float) -> None:
        ticks = max(0, round(grace_s / hostops.POLL_S))
        res = self.shell.run(
            hostops.script(_STOP, unit, ticks), sudo=self.sudo, timeout_s=grace_s + 30.0
        )
        self._check(res, what=f"systemctl stop {unit}", service=name)
        if res.stdout.strip().endswith("stuck"):
            raise LaunchError(
                f"{unit} did not stop after SIGKILL on {self.shell.name}",
                service=name,
                failure=Failure.unknown.value,
            )

    def _show(self, unit: str) -> dict[str, str]:
        props = " ".join(f"-p {p}" for p in _PROPS)
        res = self.shell.run(f"systemctl show {props} {shlex.quote(unit)}")
        out: dict[str, str] = {}
        for line in res.stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key.strip()] = value.strip()
        return out

    def _journal(self, name: str, *, lines: int | None) -> str:
        invocation = self._invocations.get(name)
        if invocation is None:
            svc = self._read_state()["services"].get(name) or {}
            invocation = str(svc.get("invocation_id") or "")
            if invocation:
                self._invocations[name] = invocation
        if invocation:
            match = shlex.quote(f"_SYSTEMD_INVOCATION_ID={invocation}")
        else:
            unit = self._unit_of(name)
            if unit is None:
                return ""
            match = f"-u {shlex.quote(unit)}"
        count = f" -n {lines}" if lines is not None else ""
        res = self.shell.run(
            f"journalctl {match}{count} -o cat --no-pager -q", sudo=self.sudo, timeout_s=60.0
        )
        return res.stdout

    def _unit_of(self, name: str) -> str | None:
        unit = self._units.get(name)
        if unit is None:
            svc = self._read_state()["services"].get(name) or {}
            unit = svc.get("unit")
            if unit:
                self._units[name] = str(unit)
        return str(unit) if unit else None

    def _systemctl(self, args: str, *, what: str | None, service: str) -> CommandResult:
        res = self.shell.run(f"systemctl {args}", sudo=self.sudo, timeout_s=120.0)
        if what is not None:
            self._check(res, what=what, service=service)
        return res

    def _check(self, res: CommandResult, *, what: str, service: str) -> None:
        if not res.ok:
            detail = (res.stderr or res.stdout).strip()[-500:] or "no output"
            raise LaunchError(
                f"{what} failed on {self.shell.name} (exit code {res.exit_code}): {detail}",
                service=service,
                failure=Failure.unknown.value,
            )

    def _read_state(self) -> dict[str, Any]:
        res = self.shell.run(f"cat {shlex.quote(self.state_file)} 2>/dev/null")
        state: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            loaded = json.loads(res.stdout) if res.stdout.strip() else {}
            state = loaded if isinstance(loaded, dict) else {}
        units = state.get("units")
        services = state.get("services")
        return {
            "version": 1,
            "deployment": self.deployment,
            "units": units if isinstance(units, dict) else {},
            "services": services if isinstance(services, dict) else {},
        }

    def _write_state(self, state: dict[str, Any]) -> None:
        if not state["units"] and not state["services"]:
            self.shell.run(f"rm -f {shlex.quote(self.state_file)}")
            return
        text = json.dumps(state, indent=2, sort_keys=True) + "\n"
        self.shell.put_text(self.state_file, text, mode=0o600)


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
