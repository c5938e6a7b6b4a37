"""The systemd drop-in autotune writes over a user's unit while it tunes it.

``/etc/systemd/system/UNIT.d/50-autotune.conf`` replaces the command and adds (or removes)
environment variables of an existing unit, leaving the unit file itself untouched, so
``autotune restore`` only has to delete one file. Quoting and validation are
:mod:`autotune.unitfile`'s, shared with the systemd export: one ``Environment="NAME=value"``
per variable, ``$`` and ``%`` escaped in ``ExecStart=``, newlines refused.

Besides the trial's command and environment the drop-in sets:

* ``Restart=no``: a configuration that crashes must stay crashed. With the unit's own
  ``Restart=on-failure`` systemd would report the unit ``activating`` (auto-restart) and the
  launcher would never see the failure, while the crash repeats every ``RestartSec``.
* ``StartLimitIntervalSec=0`` (``[Unit]``): tuning restarts a unit far more often than
  systemd's default start rate limit (5 starts in 10 s) expects of a service.
* for the engine's scratch variables (``spec.scratch_env``: vLLM's ``VLLM_RPC_BASE_PATH``),
  a ``RuntimeDirectory=`` they point at, which systemd removes at each stop; like any
  variable of the trial, the drop-in's value wins over one in the unit's own file.

Mode: ``0644`` like any unit file, ``0600`` when it holds a secret: a variable whose name
looks secret or a secret flag's value on the command line (:func:`autotune.secrets.looks_secret`:
``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``--api-key``), because ``/etc/systemd/system`` is
world-readable.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping, Sequence

from autotune.errors import ConfigError
from autotune.secrets import looks_secret, redact_argv
from autotune.specs import ServiceSpec, scratch_name
from autotune.unitfile import (
    DROPIN_NAME,
    check_env_name,
    environment_line,
    exec_line,
    scratch_lines,
)

__all__ = [
    "DROPIN_NAME",
    "dropin_mode",
    "dropin_path",
    "looks_secret",
    "normalize_unit",
    "render_dropin",
]

_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")
_OTHER_TYPES = frozenset(
    {"socket", "target", "timer", "mount", "automount", "path", "slice", "scope", "device", "swap"}
)


def dropin_mode(env: Mapping[str, str], argv: Sequence[str] = ()) -> int:
    """``0o600`` when any variable looks secret or ``argv`` carries a secret flag's value,
    else ``0o644``."""
    secret_arg = redact_argv(argv) != list(argv)
    return 0o600 if secret_arg or any(looks_secret(name) for name in env) else 0o644


def normalize_unit(unit: str | None, *, service: str) -> str:
    """The full unit name (``.service`` added when no type suffix is given)."""
    if not unit:
        raise ConfigError(
            f"service '{service}' is managed by systemd but names no unit",
            field=f"services.{service}.unit",
        )
    if not _UNIT.fullmatch(unit) or unit.startswith("-"):
        raise ConfigError(
            f"service '{service}': '{unit}' is not a valid unit name "
            "(letters, digits, ':', '_', '.', '@', '-', '\\')",
            field=f"services.{service}.unit",
        )
    suffix = unit.rsplit(".", 1)[-1] if "." in unit else ""
    if suffix in _OTHER_TYPES:
        raise ConfigError(
            f"service '{service}': unit '{unit}' is a .{suffix} unit; only .service units "
            "run a command",
            field=f"services.{service}.unit",
        )
    if suffix != "service":
        unit += ".service"  # what systemctl assumes for a name without a unit type
    return unit


def dropin_path(unit_dir: str, unit: str) -> str:
    """``UNIT_DIR/UNIT.d/50-autotune.conf``."""
    return posixpath.join(unit_dir, f"{unit}.d", DROPIN_NAME)


def render_dropin(spec: ServiceSpec, *, executable: str, deployment: str, unit: str) -> str:
    """The drop-in text for ``spec``; ``executable`` is argv[0] resolved on the host.

    Raises :class:`ConfigError` for values a unit file cannot carry (newlines, control
    characters), invalid variable names, a variable both set and unset, a relative
    executable or working directory.
    """
    name = spec.name
    if not spec.argv:
        raise ConfigError(f"service '{name}' has an empty argv", field=f"services.{name}.argv")
    if not os.path.isabs(executable):
        raise ConfigError(
            f"service '{name}': ExecStart= needs an absolute executable path, got '{executable}'",
            field=f"services.{name}.argv[0]",
        )
    both = sorted(set(spec.env) & set(spec.unset_env))
    if both:
        raise ConfigError(
            f"service '{name}': variables both set and unset: {both}",
            field=f"services.{name}.unset_env",
        )
    env_lines = [environment_line(k, v, service=name) for k, v in sorted(spec.env.items())]
    unset = sorted(set(spec.unset_env))
    for var in unset:
        check_env_name(var, service=name)
    lines = [
        f"# Written by autotune (deployment '{deployment}', service '{name}') while it tunes",
        f"# {unit}. Removed by `autotune restore`; do not edit. The empty ExecStart= clears",
        "# the unit's own command before the trial's one.",
        "[Unit]",
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        *env_lines,
    ]
    if unset:
        lines.append("UnsetEnvironment=" + " ".join(unset))
    lines += scratch_lines(spec.scratch_env, scratch_name(unit, name), service=name)
    if spec.workdir is not None:
        lines.append("WorkingDirectory=" + _workdir(spec.workdir, service=name))
    lines += [
        "ExecStart=",
        exec_line([executable, *spec.argv[1:]], service=name),
        "Restart=no",
    ]
    return "\n".join(lines) + "\n"


def _workdir(path: str, *, service: str) -> str:
    """An absolute directory written verbatim; ``%`` and control characters are refused
    rather than escaped (no real model server lives in such a directory)."""
    if not os.path.isabs(path) or "%" in path or any(ord(c) < 32 or c == "\x7f" for c in path):
        raise ConfigError(
            f"service '{service}': working directory {path!r} must be an absolute path "
            "without '%' or control characters",
            field=f"services.{service}.workdir",
        )
    return path
