"""The cross-field checks of a deployment file, run when it is loaded.

What pydantic cannot see field by field: ``on:`` and ``depends_on`` references, dependency
cycles, roles, managers and units, ports (fixed, ``auto``, shared), the templates of every
string and the URLs. Apart from the models (:mod:`autotune.deployment._model`) because they
read the whole file at once; :func:`autotune.deployment._loading.parse_deployment` runs
:func:`_check` on every file it loads.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from autotune.dependencies import DependencyError, dependency_order
from autotune.deployment._model import _NAME_RX, PORT_AUTO, Deployment, ServiceDef
from autotune.errors import ConfigError
from autotune.hosts import validate_hosts
from autotune.pinned_env import PINNED_ENV, pinned_problem
from autotune.templates import TEMPLATE_RX as _TEMPLATE_RX
from autotune.templates import AnyEnviron, expand

_UNIT_FILE_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""What a systemd unit file cannot carry in a setting (a tab is escaped, the rest not)."""


# --------------------------------------------------------------------- templates
def _global_names(dep: Deployment) -> dict[str, str]:
    """Placeholder values for every name allowed at the top level (for checking)."""
    names = {"python": "", "deployment": "", "run_dir": "", "sim_speedup": "", "deployment_dir": ""}
    for n, s in dep.services.items():
        names[f"{n}.host"] = ""
        names[f"{n}.port"] = ""
        names.update({f"{n}.ports.{k}": "" for k in s.ports})
    if dep.model is not None:
        names["model"] = ""
    return names


def _template_fields(dep: Deployment) -> list[tuple[str, str, str | None]]:
    """(field path, text, service) for every string that may hold templates."""
    out: list[tuple[str, str, str | None]] = [("endpoint", dep.endpoint, None)]
    for n, s in dep.services.items():
        base = f"services.{n}"
        out += [(f"{base}.command[{i}]", t, n) for i, t in enumerate(s.command)]
        out += [(f"{base}.wrapper[{i}]", t, n) for i, t in enumerate(s.wrapper)]
        out += [(f"{base}.env.{k}", v, n) for k, v in s.env.items()]
        out += [(f"{base}.health.url", s.health.url, n), (f"{base}.log_file", s.log_file, n)]
        if s.info_url is not None:
            out.append((f"{base}.info_url", s.info_url, n))
        if s.metrics_url is not None:
            out.append((f"{base}.metrics_url", s.metrics_url, n))
        if s.workdir is not None:
            out.append((f"{base}.workdir", s.workdir, n))
    return out


# --------------------------------------------------------------------- checks
def _check_role(dep: Deployment, name: str, *, base: str, file: str) -> None:
    """A role names a service kind: one of this deployment's services that has no role of
    its own (a replica of a replica would hide which settings it runs), or a new name."""
    role = dep.services[name].role
    if role is None:
        return
    if not _NAME_RX.fullmatch(role):
        raise ConfigError(
            f"role {role!r} must be letters, digits, '_' or '-'", file=file, field=f"{base}.role"
        )
    other = dep.services.get(role)
    if other is not None and other.role not in (None, role) or role == name:
        allowed = sorted(n for n, s in dep.services.items() if s.role is None and n != name)
        raise ConfigError(
            f"role {role!r}: a service takes the levers of a service without a role "
            f"(or of a new role name), not of itself or of another replica",
            file=file,
            field=f"{base}.role",
            allowed=allowed,
        )


def _check(dep: Deployment) -> None:
    """Cross-field rules pydantic cannot see: references, cycles, ports, templates."""
    file = dep.file_label
    names = list(dep.services)
    validate_hosts(dep.hosts, file=file)
    for n, s in dep.services.items():
        base = f"services.{n}"
        for var, value in s.env.items():
            problem = pinned_problem(var, value)
            if problem is not None:
                raise ConfigError(
                    problem, file=file, field=f"{base}.env.{var}", allowed=[PINNED_ENV[var]]
                )
        if s.on is not None and s.on not in dep.hosts:
            raise ConfigError(
                f"unknown host {s.on!r}"
                + (
                    ""
                    if dep.hosts
                    else ": the file has no `hosts:` (without `on:` the service runs here)"
                ),
                file=file,
                field=f"{base}.on",
                allowed=sorted(dep.hosts) or None,
            )
        manager = s.resolved_manager()
        if manager == "local" and s.on is not None:
            raise ConfigError(
                "a service on an SSH host needs manager process or systemd",
                file=file,
                field=f"{base}.manager",
                allowed=["process", "systemd"],
            )
        if manager == "systemd" and not s.unit:
            raise ConfigError("manager systemd needs `unit:`", file=file, field=f"{base}.unit")
        if s.on is not None and s.port == PORT_AUTO:
            raise ConfigError(
                "a service on an SSH host needs a fixed port (auto picks a free port on this "
                "machine only)",
                file=file,
                field=f"{base}.port",
            )
        _check_extra_ports(s, base=base, file=file)
        _check_role(dep, n, base=base, file=file)
        if manager == "systemd":
            for field, text, _ in _template_fields(dep):
                if field.startswith(f"{base}.") and _UNIT_FILE_CONTROL.search(text):
                    raise ConfigError(
                        f"{text!r} contains a newline or control character, which a systemd "
                        "unit file cannot carry (use a wrapper script)",
                        file=file,
                        field=field,
                    )
        if s.unit is not None and manager != "systemd":
            raise ConfigError(
                "`unit:` is only for manager systemd",
                file=file,
                field=f"{base}.manager",
                allowed=["systemd"],
            )
    expand(dep.run_dir, {"deployment": ""}, file=file, field="run_dir", environ=AnyEnviron())
    for n, s in dep.services.items():
        for i, d in enumerate(s.depends_on):
            if d not in dep.services or d == n:
                why = "a service cannot depend on itself" if d == n else f"unknown service {d!r}"
                others = [m for m in names if m != n]
                raise ConfigError(
                    why + ("" if others else ": the file has no other service"),
                    file=file,
                    field=f"services.{n}.depends_on[{i}]",
                    allowed=others or None,
                )
    try:
        dependency_order({n: s.depends_on for n, s in dep.services.items()})
    except DependencyError as exc:
        raise ConfigError(str(exc), file=file, field=f"services.{exc.service}.depends_on") from None
    seen: dict[tuple[str, int], str] = {}
    for n, s in dep.services.items():
        listeners = [("port", s.port)] + [(f"ports.{k}", v) for k, v in s.ports.items()]
        for where, port in listeners:
            if isinstance(port, int):
                key = (s.host, port)
                if key in seen:
                    raise ConfigError(
                        f"port {port} on {s.host} is already used by {seen[key]}",
                        file=file,
                        field=f"services.{n}.{where}",
                    )
                seen[key] = f"service '{n}'" + ("" if where == "port" else f" ({where})")
    top = _global_names(dep)
    for field, text, service in _template_fields(dep):
        values = dict(top)
        if service is not None:
            values.update({"service": "", "host": "", "port": ""})
            values.update({f"ports.{k}": "" for k in dep.services[service].ports})
        expand(text, values, file=file, field=field, environ=AnyEnviron())
        if field == "endpoint" or field.endswith((".health.url", ".info_url", ".metrics_url")):
            _check_url(text, file=file, field=field)


def _check_extra_ports(s: ServiceDef, *, base: str, file: str) -> None:
    """``ports:``: names usable in templates, each value a port 1..65535 or ``auto``."""
    for name, value in s.ports.items():
        field = f"{base}.ports.{name}"
        if not _NAME_RX.fullmatch(name):
            raise ConfigError(
                f"port name {name!r} must be letters, digits, '_' or '-' (no dots): it is "
                "used as ${ports.NAME}",
                file=file,
                field=field,
            )
        valid = value == PORT_AUTO or (
            isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
        )
        if not valid:
            raise ConfigError(
                f"must be an integer 1..65535 or 'auto', got {value!r}",
                file=file,
                field=field,
                allowed=["1..65535", PORT_AUTO],
            )
        if s.on is not None and value == PORT_AUTO:
            raise ConfigError(
                "a service on an SSH host needs fixed ports (auto picks a free port on this "
                "machine only)",
                file=file,
                field=field,
            )


def _check_url(text: str, *, file: str, field: str) -> None:
    """A URL field, with sample values for its templates, is http(s)://HOST[:PORT]/...:
    the load generator and the health checks would otherwise fail at the first trial."""
    sample = _TEMPLATE_RX.sub(
        lambda m: (
            "${" + m.group(2) + "}"
            if m.group(1)
            else ("1" if m.group(2).strip().endswith("port") else "h")
        ),
        text,
    )
    problem = None
    try:
        parts = urlsplit(sample)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problem = "expected http(s)://HOST:PORT/..."
        elif any(c.isspace() or ord(c) < 32 for c in sample):
            problem = "a URL cannot contain spaces or control characters"
    if problem is not None:
        raise ConfigError(f"invalid URL {text!r}: {problem}", file=file, field=field)
