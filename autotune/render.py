"""Rendering: deployment + one trial's settings -> fully resolved :class:`ServiceSpec` s.

For each service the deployment's command and environment are the base; the search space's
:class:`~autotune.space.settings.ServiceSettings` for that service are applied on top:

* a flag already in the base command gets its value replaced **in place** (``--x v`` and
  ``--x=v`` forms kept); later repeats of it are dropped, so no flag is ever emitted twice;
* a flag not in the base is appended (sorted by name, ``--x v`` form; ``None`` = switch);
* a flag in ``remove_flags`` is removed with its value; a flag's value is the tokens up to
  the next ``--flag``, in both forms (a switch has none; ``--prefill URL 8998`` has two);
* ``env`` is merged over the base environment; ``unset_env`` removes variables from it and
  is carried in ``ServiceSpec.unset_env`` so the launcher also removes them from the
  environment it inherits (``NCCL_PROTO`` set in the shell must not leak into a trial);
* the variables of :data:`autotune.pinned_env.PINNED_ENV` (NVLink multicast off) are set last,
  in every service, so the environment the launcher inherits cannot turn multicast on either.

Only tokens after the program (``python -m module``), i.e. from the first ``--flag`` on,
are edited; ``wrapper`` (``numactl ...``) is never edited. Output is deterministic: the same
config gives the same argv, env and fingerprint. Setting values are used literally (no
templates).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from autotune.cpus import format_cpu_list
from autotune.deployment import Deployment
from autotune.engines import scratch_env_for
from autotune.errors import ConfigError
from autotune.pinned_env import PINNED_ENV
from autotune.space.settings import ServiceSettings
from autotune.specs import ServiceSpec
from autotune.templates import expand
from autotune.yamlio import one_line_errors


class SettingsSource(Protocol):
    """What rendering needs from a search space."""

    @property
    def services(self) -> Collection[str]:
        """Services the space may set levers on."""
        ...

    def settings_for(self, service: str, config: Mapping[str, object]) -> ServiceSettings:
        """Flags and environment that ``config`` sets on ``service``."""
        ...


@dataclass
class _Opt:
    flag: str
    values: list[str] = field(default_factory=list)
    eq: bool = False  # written as --flag=value (further values follow as tokens)

    def tokens(self) -> list[str]:
        if self.eq and self.values:
            return [f"{self.flag}={self.values[0]}", *self.values[1:]]
        return [self.flag, *self.values]


def _parse(argv: list[str]) -> tuple[list[str], list[_Opt | str]]:
    """Split argv into the program part and a list of options (and stray positionals)."""
    head: list[str] = []
    items: list[_Opt | str] = []
    i = 0
    while i < len(argv) and not argv[i].startswith("--"):
        head.append(argv[i])
        i += 1
    current: _Opt | None = None
    while i < len(argv):
        tok = argv[i]
        if tok == "--":  # end of options: the rest is verbatim
            items.extend(argv[i:])
            break
        if tok.startswith("--"):
            if "=" in tok:
                flag, value = tok.split("=", 1)
                current = _Opt(flag, [value], eq=True)
            else:
                current = _Opt(tok)
            items.append(current)
        else:
            assert current is not None  # the first token here starts with "--"
            current.values.append(tok)
        i += 1
    return head, items


def _check_flag(flag: str, *, service: str) -> None:
    if not flag.startswith("--") or len(flag) < 3 or "=" in flag or any(c.isspace() for c in flag):
        raise ConfigError(
            f"search space produced an invalid flag name {flag!r} (expected '--long-name')",
            field=f"services.{service}",
        )


def _value(value: object, *, what: str, service: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(
        f"{what} has a {type(value).__name__} value {value!r}; expected a string",
        field=f"services.{service}",
    )


def apply_flags(argv: list[str], settings: ServiceSettings, *, service: str) -> list[str]:
    """The base ``argv`` with ``settings.flags`` / ``remove_flags`` applied (see module doc)."""
    for flag in [*settings.flags, *settings.remove_flags]:
        _check_flag(flag, service=service)
    both = sorted(set(settings.flags) & set(settings.remove_flags))
    if both:
        raise ConfigError(
            f"search space both sets and removes {', '.join(both)}", field=f"services.{service}"
        )
    wanted: dict[str, list[str]] = {
        f: []
        if v is None
        else [_value(x, what=f, service=service) for x in v]
        if isinstance(v, tuple)
        else [_value(v, what=f, service=service)]
        for f, v in settings.flags.items()
    }
    head, items = _parse(argv)
    out: list[_Opt | str] = []
    done: set[str] = set()
    for item in items:
        if isinstance(item, str):
            out.append(item)
            continue
        if item.flag in settings.remove_flags:
            continue
        if item.flag in wanted:
            if item.flag in done:
                continue
            item.values = list(wanted[item.flag])
            item.eq = item.eq and bool(item.values)
            done.add(item.flag)
        out.append(item)
    for flag in sorted(set(wanted) - done):
        out.append(_Opt(flag, list(wanted[flag])))
    tokens = list(head)
    for item in out:
        tokens += [item] if isinstance(item, str) else item.tokens()
    return tokens


def render(
    space: SettingsSource | None,
    deployment: Deployment,
    config: Mapping[str, object],
    *,
    run_dir: str | Path | None = None,
) -> dict[str, ServiceSpec]:
    """Resolved specs, in the deployment's service order, for one trial ``config``.

    ``run_dir`` (default: the deployment's ``run_dir``) is made absolute; log files and
    ``${run_dir}`` resolve against it. ``space=None`` renders the bare deployment.
    """
    with one_line_errors():
        return _render(space, deployment, config, run_dir=run_dir)


def _render(
    space: SettingsSource | None,
    deployment: Deployment,
    config: Mapping[str, object],
    *,
    run_dir: str | Path | None,
) -> dict[str, ServiceSpec]:
    rd = Path(run_dir).expanduser().resolve() if run_dir is not None else None
    rd = rd if rd is not None else deployment.default_run_dir()
    file = deployment.file_label
    targeted = set(space.services) if space is not None else set()
    roles = deployment.roles()
    unknown = sorted(targeted - set(roles))
    if unknown:
        raise ConfigError(
            f"search space sets levers on service(s) {', '.join(unknown)} that deployment "
            f"'{deployment.name}' does not have (as a service or a role)",
            file=file,
            field="services",
            allowed=list(roles),
        )
    ports = deployment.ports()
    placed = deployment.services_cpu_set()
    services_cpus = None if placed is None else format_cpu_list(placed)
    specs: dict[str, ServiceSpec] = {}
    for name, svc in deployment.services.items():
        ctx = deployment.template_context(run_dir=rd, service=name)
        base = f"services.{name}"

        def ex(text: str, where: str, ctx: dict[str, str] = ctx, base: str = base) -> str:
            return expand(text, ctx, file=file, field=f"{base}.{where}")

        argv = [ex(t, f"command[{i}]") for i, t in enumerate(svc.command)]
        env = {k: ex(v, f"env.{k}") for k, v in svc.env.items()}
        role = deployment.role_of(name)
        settings = (
            space.settings_for(role, config)
            if space is not None and role in targeted
            else ServiceSettings()
        )
        argv = apply_flags(argv, settings, service=name)
        clash = sorted(set(settings.env) & set(settings.unset_env))
        if clash:
            raise ConfigError(f"search space both sets and unsets {', '.join(clash)}", field=base)
        for key, value in settings.env.items():
            env[key] = _value(value, what=f"env {key}", service=name)
        for key in settings.unset_env:
            env.pop(key, None)
        env.update(PINNED_ENV)  # NVLink multicast off in every service (autotune/pinned_env.py)
        wrapper = [ex(t, f"wrapper[{i}]") for i, t in enumerate(svc.wrapper)]
        if (
            services_cpus is not None
            and svc.resolved_manager() == "local"
            and Path((wrapper + argv)[0]).name != "taskset"
        ):
            wrapper = ["taskset", "-c", services_cpus, *wrapper]
        log_file = Path(ex(svc.log_file, "log_file")).expanduser()
        workdir = ex(svc.workdir, "workdir") if svc.workdir is not None else None
        specs[name] = ServiceSpec(
            name=name,
            argv=tuple(wrapper + argv),
            env=dict(sorted(env.items())),
            unset_env=tuple(sorted(settings.unset_env)),
            scratch_env=scratch_env_for(argv, env=env, unset=settings.unset_env),
            host=svc.host,
            port=ports[name],
            health_url=ex(svc.health.url, "health.url"),
            ready_timeout_s=svc.health.timeout_s,
            log_file=str(log_file if log_file.is_absolute() else rd / log_file),
            workdir=str(Path(workdir).expanduser().resolve()) if workdir is not None else None,
            depends_on=tuple(svc.depends_on),
            info_url=ex(svc.info_url, "info_url") if svc.info_url is not None else None,
            metrics_url=(
                ex(svc.metrics_url, "metrics_url") if svc.metrics_url is not None else None
            ),
            on=svc.on,
            manager=svc.resolved_manager(),  # type: ignore[arg-type]
            unit=svc.unit,
            role=svc.role,
        )
        if svc.resolved_manager() == "systemd":
            _check_unit_file_values(specs[name], file=file)
    return specs


_UNIT_FILE_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _check_unit_file_values(spec: ServiceSpec, *, file: str) -> None:
    """A systemd drop-in cannot carry a newline or control character: refuse the trial's
    value here, naming the deployment and the service, before any unit is touched."""
    values = [("argv", a) for a in spec.argv] + [(f"env.{k}", v) for k, v in spec.env.items()]
    for where, value in values:
        if _UNIT_FILE_CONTROL.search(value):
            raise ConfigError(
                f"{value!r} contains a newline or control character, which the systemd "
                "drop-in cannot carry (a search-space value? use a wrapper script)",
                file=file,
                field=f"services.{spec.name}.{where}",
            )
