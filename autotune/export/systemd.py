"""The winning trial as systemd units, drop-ins, an install script and a README.

Quoting of values (systemd.exec(5), systemd.service(5), systemd.syntax(7)) is
:mod:`autotune.unitfile`'s, shared with the drop-in the systemd service manager writes.

systemd starts services with a clean environment: only the variables of the trial, those
the services inherited from autotune's environment while measured (folded into ``env`` by
:mod:`autotune.export.inherited`) and systemd's own are set: what the tuner measured.

Credentials (:mod:`autotune.export.credentials`) never go into a unit: ``Environment=`` and
``ExecStart=`` are readable by every user (``systemctl show``), whatever the file's mode.
A service with secrets gets ``EnvironmentFile=SECRETS_DIR/autotune-NAME.env``, written
beside the units as ``secrets/autotune-NAME.env`` (directory 0700, file 0600) with the
values of the current deployment (``current``) or of autotune's environment, else
:data:`PLACEHOLDER` and a note;
a secret flag becomes ``--api-key ${AUTOTUNE_SECRET_API_KEY}`` (one argument, substituted by
systemd at start). ``install.sh`` installs the file 0600 and refuses while a placeholder is
left, so a unit never starts with a blank credential.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune.engines import scratch_env_for
from autotune.errors import ConfigError
from autotune.export.credentials import (
    PLACEHOLDER,
    Ref,
    ServiceLike,
    SplitService,
    redact_trial,
    resolve,
    split_service,
)
from autotune.export.topology import dependencies, start_order
from autotune.results import ServiceRecord, TrialResult
from autotune.specs import scratch_name
from autotune.unitfile import (
    CONTROL,
    DROPIN_NAME,
    SAFE_WORD,
    check_env_name,
    check_text,
    environment_line,
    escape,
    exec_line,  # noqa: F401  (re-exported: it was defined here)
    exec_word,
    scratch_lines,
)

DEFAULT_READY_TIMEOUT_S = 600.0
"""Start-up budget when the study did not store one (ServiceSpec's default)."""
RESTART_SEC = 10
LIMIT_NOFILE = 1048576
SECRETS_DIR = "/etc/autotune"
"""Where ``install.sh`` puts the units' secret environment files (``EnvironmentFile=``)."""

_UNIT_CHARS = re.compile(r"^[A-Za-z0-9:_.@-]+$")


def export_systemd(
    trial: TrialResult,
    *,
    out_dir: Path,
    unit_prefix: str = "autotune-",
    user: str | None = None,
    working_directory: str | Path | None = None,
    current: Mapping[str, ServiceLike] | None = None,
    secrets_dir: str = SECRETS_DIR,
    environ: Mapping[str, str] | None = None,
    notes: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write ``units/``, ``dropins/``, ``secrets/`` (services with credentials only),
    ``install.sh`` and ``README.txt`` under ``out_dir``.

    ``current``: the deployment's services as they are now (rendered specs), where secret
    values are looked up first; then ``environ`` (default ``os.environ``). ``notes`` is
    told about each secret left as a placeholder. Returns the written files. Raises
    :class:`ConfigError` for values a unit file cannot carry (newlines), executables that
    cannot be resolved to an absolute path, and invalid unit or variable names.
    """
    trial = redact_trial(trial)
    if not trial.services:
        raise ConfigError(f"trial {trial.number} has no services to export", field="services")
    if user is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?", user):
        raise ConfigError(f"invalid user name {user!r}", field="user")
    workdir = str(working_directory) if working_directory is not None else None
    if workdir is not None and not os.path.isabs(workdir):
        raise ConfigError(
            f"working directory must be an absolute path, got {workdir!r}",
            field="working_directory",
        )
    if not os.path.isabs(secrets_dir) or CONTROL.search(secrets_dir) or "%" in secrets_dir:
        raise ConfigError(f"invalid secrets directory {secrets_dir!r}", field="secrets_dir")
    units = {name: _unit_name(unit_prefix, name) for name in trial.services}
    deps = dependencies(trial.services)
    order = start_order(trial.services)

    rendered: dict[str, tuple[str, str]] = {}
    secret_files: dict[str, tuple[str, list[str]]] = {}
    for name, rec in trial.services.items():
        split = split_service(rec)
        env_file = posixpath_join(secrets_dir, _env_name(units[name])) if split.slots else None
        service_lines = _service_lines(
            name,
            rec,
            split,
            user=user,
            workdir=workdir if workdir is not None else rec.workdir,
            env_file=env_file,
            unit=units[name],
        )
        rendered[name] = (
            _unit_text(trial, name, [units[d] for d in deps[name]], service_lines),
            _dropin_text(trial, name, rec, service_lines),
        )
        if split.slots:
            secret_files[name] = _secrets_text(
                trial, name, units[name], split, current=(current or {}).get(name), environ=environ
            )

    out_dir = Path(out_dir)
    written: list[Path] = []
    for name in order:
        unit_text, dropin_text = rendered[name]
        unit_path = out_dir / "units" / units[name]
        dropin_path = out_dir / "dropins" / f"{units[name]}.d" / DROPIN_NAME
        for path, text in ((unit_path, unit_text), (dropin_path, dropin_text)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
        if name in secret_files:
            text, missing = secret_files[name]
            path = out_dir / "secrets" / _env_name(units[name])
            _write_private(path, text)
            written.append(path)
            for var in missing:
                if notes is not None:
                    notes(
                        f"{units[name]}: fill in {var} in {path} (a secret autotune does not "
                        "store); install.sh refuses to install until then"
                    )
    with_secrets = [units[n] for n in order if n in secret_files]
    script = out_dir / "install.sh"
    script.write_text(
        _install_script(trial, [units[n] for n in order], with_secrets, secrets_dir),
        encoding="utf-8",
    )
    script.chmod(0o755)
    readme = out_dir / "README.txt"
    readme.write_text(_readme(trial, units, order, with_secrets, secrets_dir), encoding="utf-8")
    return [*written, script, readme]


def posixpath_join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


def _env_name(unit: str) -> str:
    """``autotune-decode.service`` -> ``autotune-decode.env``."""
    return unit.removesuffix(".service") + ".env"


def _write_private(path: Path, text: str) -> None:
    """Owner-only directory and file, the file never readable by others, even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.parent.chmod(0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _secrets_text(
    trial: TrialResult,
    service: str,
    unit: str,
    split: SplitService,
    *,
    current: ServiceLike | None,
    environ: Mapping[str, str] | None,
) -> tuple[str, list[str]]:
    """The ``EnvironmentFile=`` text and the variables left as placeholders."""
    lines = [
        f"# Secrets of {unit} (autotune {trial.title}, service '{service}'): keep this",
        "# file owner-only (0600). autotune never stores these values; they come from the",
        "# deployment or environment at export time, or are placeholders to fill in.",
    ]
    missing: list[str] = []
    for slot in split.slots:
        value = resolve(slot, current=current, environ=environ)
        if value is None:
            missing.append(slot.var)
            lines.append(f"# {slot.var}: {slot.what}: FILL IN (replace {PLACEHOLDER})")
            value = PLACEHOLDER
        else:
            lines.append(f"# {slot.var}: {slot.what}")
        check_text(value, what=f"secret {slot.var}", service=service)
        lines.append(f"{slot.var}={_env_file_value(value)}")
    return "\n".join(lines) + "\n", missing


def _env_file_value(value: str) -> str:
    """A value as systemd's EnvironmentFile= parser reads it back literally: single quotes
    (no escapes inside), else double quotes with ``\\ " ` $`` escaped."""
    if "'" not in value:
        return f"'{value}'"
    escaped = re.sub(r'([\\"`$])', r"\\\1", value)
    return f'"{escaped}"'


def resolve_executable(argv0: str, *, service: str) -> str:
    """Absolute path of argv[0] (``shutil.which``); systemd does not search a user's PATH."""
    found = shutil.which(argv0)
    if found is None:
        raise ConfigError(
            f"service '{service}': executable '{argv0}' not found or not executable; "
            "ExecStart= needs an absolute path to an existing program (export on the "
            "machine that runs the service, or put the program on PATH)",
            field=f"services.{service}.argv[0]",
        )
    return os.path.abspath(found)


def _unit_name(prefix: str, service: str) -> str:
    name = f"{prefix}{service}.service"
    if not _UNIT_CHARS.fullmatch(f"{prefix}{service}"):
        raise ConfigError(
            f"'{name}' is not a valid unit name (letters, digits, ':', '_', '.', '-', '@')",
            field="unit_prefix",
        )
    return name


def _service_lines(
    name: str,
    rec: ServiceRecord,
    split: SplitService,
    *,
    user: str | None,
    workdir: str | None,
    env_file: str | None,
    unit: str,
) -> dict[str, list[str]]:
    """Shared [Service] settings of unit and drop-in, grouped by purpose."""
    if not rec.argv:
        raise ConfigError(f"service '{name}' has an empty argv", field=f"services.{name}.argv")
    both = sorted(set(rec.env) & set(rec.unset_env))
    if both:
        raise ConfigError(
            f"service '{name}': variables both set and unset: {both}",
            field=f"services.{name}.unset_env",
        )
    env = [environment_line(k, v, service=name) for k, v in sorted(split.env.items())]
    for slot in split.slots:
        check_env_name(slot.var, service=name)
    if env_file is not None:
        # Settings from the file override Environment=; a missing file fails the start
        # (no "-" prefix) rather than starting the server without its credential.
        env.append("EnvironmentFile=" + env_file)
    unset: list[str] = []
    if rec.unset_env:
        for var in sorted(rec.unset_env):
            check_env_name(var, service=name)
        unset = ["UnsetEnvironment=" + " ".join(sorted(rec.unset_env))]
    # What the tuner's managers gave the engine (vLLM's sockets: a directory systemd removes
    # at each stop, instead of ~7 files left in /tmp per restart), unless the study set it.
    scratch = scratch_env_for(rec.argv, env=rec.env, unset=rec.unset_env)
    unset += scratch_lines(scratch, scratch_name(unit, name), service=name)
    if isinstance(split.argv[0], Ref):
        raise ConfigError(f"service '{name}': argv[0] is a secret", field=f"services.{name}.argv")
    ready = rec.ready_timeout_s if rec.ready_timeout_s is not None else DEFAULT_READY_TIMEOUT_S
    identity: list[str] = []
    if user is not None:
        identity.append(f"User={user}")
    if workdir is not None:
        check_text(workdir, what="working directory", service=name)
        identity.append("WorkingDirectory=" + workdir.replace("%", "%%"))
    return {
        "identity": identity,
        "env": env + unset,
        "exec": [_exec_with_refs(split.argv, service=name)],
        # Model loading happens after start; give it the readiness budget plus half again.
        "timeout": [f"TimeoutStartSec={max(90, math.ceil(ready * 1.5))}"],
    }


def _exec_with_refs(argv: list[str | Ref], *, service: str) -> str:
    """``ExecStart=`` like :func:`exec_line`, with each secret word written ``${VAR}`` (one
    argument, substituted by systemd from the EnvironmentFile= at start)."""
    words: list[str] = []
    for arg in [resolve_executable(str(argv[0]), service=service), *argv[1:]]:
        if isinstance(arg, Ref):
            check_text(arg.prefix, what="command-line argument", service=service)
            if arg.prefix and not SAFE_WORD.fullmatch(arg.prefix):
                words.append(f'"{escape(arg.prefix, dollar=True)}${{{arg.var}}}"')
            else:
                words.append(f"{arg.prefix}${{{arg.var}}}")
        else:
            check_text(arg, what="command-line argument", service=service)
            words.append(exec_word(arg))
    return "ExecStart=" + " ".join(words)


def _header(trial: TrialResult, service: str) -> list[str]:
    thr = f"{trial.throughput:.1f} tok/s" if trial.throughput is not None else "n/a"
    return [
        f"# Generated by autotune: service '{service}' of {trial.title} (output throughput {thr}).",
        f"# Deployment: {trial.deployment or 'unknown'}. Do not edit; re-export instead.",
    ]


def _unit_text(
    trial: TrialResult, service: str, needs: list[str], lines: dict[str, list[str]]
) -> str:
    after = " ".join(["network-online.target", *needs])
    unit = [
        "[Unit]",
        f"Description=autotune {service} ({trial.title})",
        f"After={after}",
        "Wants=network-online.target",
    ]
    if needs:
        # Requires=: a restart or stop of a worker restarts or stops this service too.
        unit.append("Requires=" + " ".join(needs))
    body = [
        *_header(trial, service),
        *unit,
        "",
        "[Service]",
        "Type=simple",
        *lines["identity"],
        *lines["env"],
        *lines["exec"],
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        *lines["timeout"],
        "KillMode=control-group",
        f"LimitNOFILE={LIMIT_NOFILE}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(body) + "\n"


def _dropin_text(
    trial: TrialResult, service: str, rec: ServiceRecord, lines: dict[str, list[str]]
) -> str:
    body = [
        *_header(trial, service),
        "# Drop-in for an existing unit: later Environment= assignments of a name override",
        "# earlier ones; the empty ExecStart= clears the unit's command before the new one.",
        "[Service]",
        *lines["env"],
        "ExecStart=",
        *lines["exec"],
        *lines["timeout"],
    ]
    return "\n".join(body) + "\n"


def _install_script(
    trial: TrialResult, ordered_units: list[str], with_secrets: list[str], secrets_dir: str
) -> str:
    units = " ".join(shlex.quote(u) for u in ordered_units)
    secret_units = " ".join(shlex.quote(u) for u in with_secrets)
    return f"""#!/bin/sh
# Install the services of autotune {trial.title} and restart them in dependency order.
#   ./install.sh            full units      -> $UNIT_DIR/NAME.service (and enable them)
#   ./install.sh dropins    drop-ins        -> $UNIT_DIR/NAME.service.d/{DROPIN_NAME}
# Secrets (secrets/NAME.env) -> $SECRETS_DIR/NAME.env, mode 0600; the units read them from
# {secrets_dir} (EnvironmentFile=). Refused while a {PLACEHOLDER} placeholder is left.
# UNIT_DIR defaults to /etc/systemd/system; SYSTEMCTL to systemctl; SECRETS_DIR to
# {secrets_dir}.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
UNIT_DIR=${{UNIT_DIR:-/etc/systemd/system}}
SYSTEMCTL=${{SYSTEMCTL:-systemctl}}
SECRETS_DIR=${{SECRETS_DIR:-{shlex.quote(secrets_dir)}}}
MODE=${{1:-units}}
UNITS="{units}"
SECRET_UNITS="{secret_units}"

case "$MODE" in units|dropins) ;; *) echo "usage: $0 [units|dropins]" >&2; exit 2 ;; esac
for unit in $SECRET_UNITS; do
  if grep -q '{PLACEHOLDER}' "$HERE/secrets/${{unit%.service}}.env"; then
    echo "fill in the secrets in $HERE/secrets/${{unit%.service}}.env first" >&2
    exit 1
  fi
done
for unit in $SECRET_UNITS; do
  install -d -m 0700 "$SECRETS_DIR"
  install -m 0600 "$HERE/secrets/${{unit%.service}}.env" "$SECRETS_DIR/${{unit%.service}}.env"
done

case "$MODE" in
  units)
    for unit in $UNITS; do
      install -D -m 0644 "$HERE/units/$unit" "$UNIT_DIR/$unit"
    done
    ;;
  dropins)
    for unit in $UNITS; do
      install -D -m 0644 "$HERE/dropins/$unit.d/{DROPIN_NAME}" \\
        "$UNIT_DIR/$unit.d/{DROPIN_NAME}"
    done
    ;;
  *)
    echo "usage: $0 [units|dropins]" >&2
    exit 2
    ;;
esac

$SYSTEMCTL daemon-reload
if [ "$MODE" = units ]; then
  $SYSTEMCTL enable $UNITS
fi
for unit in $UNITS; do
  echo "restarting $unit"
  $SYSTEMCTL restart "$unit"
done
echo "done; logs: journalctl -u UNIT -n 200 --no-pager"
"""


def _fmt(value: float | None, unit: str) -> str:
    return f"{value:.2f} {unit}" if value is not None else "n/a"


def _readme(
    trial: TrialResult,
    units: dict[str, str],
    order: list[str],
    with_secrets: list[str],
    secrets_dir: str,
) -> str:
    m = trial.metrics
    lines = [
        f"autotune export: {trial.title}",
        "",
        f"state: {trial.state}   feasible: {trial.feasible}   baseline: {trial.is_baseline}",
        f"deployment: {trial.deployment or 'unknown'}",
        f"output throughput: {_fmt(trial.throughput, 'tok/s')}",
        f"TPOT p99: {_fmt(trial.tpot_p99_ms, 'ms')}",
    ]
    for key, label in (("ttft_ms", "TTFT p99"), ("e2e_ms", "E2E p99")):
        sub = m.get(key)
        if isinstance(sub, dict) and isinstance(sub.get("p99"), (int, float)):
            lines.append(f"{label}: {sub['p99']:.2f} ms")
    for key in ("request_throughput", "error_rate", "goodput", "completed", "failed"):
        if key in m:
            lines.append(f"{key}: {m[key]}")
    lines += ["", "configuration:"]
    lines += [f"  {k} = {v}" for k, v in sorted(trial.config.items())]
    lines += ["", "services (start order):"]
    lines += [f"  {n}: units/{units[n]}  dropins/{units[n]}.d/{DROPIN_NAME}" for n in order]
    lines += [
        "",
        "install the full units:           sudo ./install.sh",
        "or only override existing units:  sudo ./install.sh dropins",
        "  (drop-ins are named after the generated units; rename the NAME.service.d",
        "   directory to your own unit's name if it differs)",
        "logs: journalctl -u UNIT -n 200 --no-pager",
        "",
        "note: systemd starts services with a clean environment; the units set exactly the",
        "variables the trial set (Environment=) and remove the ones it removed",
        "(UnsetEnvironment=).",
    ]
    if with_secrets:
        lines += [
            "",
            "secrets: autotune does not store credentials. These units read theirs from",
            f"{secrets_dir}/NAME.env (EnvironmentFile=, installed 0600 by install.sh from",
            "secrets/NAME.env); check those files and replace any "
            f"{PLACEHOLDER} before installing:",
            *(f"  secrets/{_env_name(u)}" for u in with_secrets),
        ]
    return "\n".join(lines) + "\n"
