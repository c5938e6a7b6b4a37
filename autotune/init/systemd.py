"""A systemd service as it runs today: ``ExecStart=``, ``Environment=``, ``EnvironmentFile=``.

``--from-systemd UNIT_FILE`` reads a unit file here (and its ``UNIT.d/*.conf`` drop-ins);
``--from-systemd HOST:UNIT`` runs ``systemctl cat UNIT`` on the host over SSH (the unit and its
drop-ins in the order systemd merges them, each after a ``# /path`` line), then reads every
``EnvironmentFile=`` it names there (``-`` before the path: a missing file is skipped, as
systemd skips it; without it a missing file is an error, as systemd fails the start).

The merge follows systemd.exec(5) and systemd.service(5): an empty ``ExecStart=``,
``Environment=`` or ``EnvironmentFile=`` resets the list; variables from the files override
``Environment=``; ``ExecStart=`` is split into words by systemd.syntax(7) (quotes, C escapes),
``%%`` is ``%`` and ``%n``/``%N`` the unit's name (other specifiers are refused: their values
belong to the host), and ``${VAR}`` / a lone ``$VAR`` take the unit's variables (``$$`` is a
literal ``$``; the ``:`` prefix turns that off).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from autotune.errors import ConfigError
from autotune.hosts import HostSpec
from autotune.init.model import RawService
from autotune.yamlio import read_text

_UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
    "/usr/local/lib/systemd/system",
)
"""Where systemd loads units from (systemd.unit(5), system manager)."""
_DEFAULT_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")
"""Vendor directories: a drop-in for their units still goes to /etc/systemd/system."""
_C_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class UnitSettings:
    """The [Service] settings autotune reads, merged over the unit and its drop-ins."""

    unit: str
    files: list[str] = field(default_factory=list)
    exec_start: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    environment_files: list[str] = field(default_factory=list)
    working_directory: str | None = None
    ignored: list[str] = field(default_factory=list)


def parse_unit(text: str, unit: str) -> UnitSettings:
    """Settings of a unit from its text (one file, or ``systemctl cat`` output)."""
    out = UnitSettings(unit=unit)
    section = ""
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and stripped.startswith("# /"):
            out.files.append(stripped[2:].strip())  # systemctl cat's header of each file
            continue
        line = pending + raw
        if line.rstrip().endswith("\\") and not line.lstrip().startswith(("#", ";")):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if key in ("ExecStart", "Environment", "EnvironmentFile"):
            target = {
                "ExecStart": out.exec_start,
                "Environment": out.environment,
                "EnvironmentFile": out.environment_files,
            }[key]
            if value:
                target.append(value)
            else:
                target.clear()
        elif key == "WorkingDirectory":
            out.working_directory = value.lstrip("-") or None
        elif key in ("ExecStartPre", "ExecStartPost", "User", "Group"):
            out.ignored.append(f"{key}={value}")
    return out


def split_words(value: str, *, unit: str, env: dict[str, str] | None, what: str) -> list[str]:
    """systemd.syntax(7) words of ``value``; with ``env``, ``${VAR}`` and a lone ``$VAR``
    substituted (ExecStart=), else ``$`` kept (Environment=)."""
    words: list[str] = []
    current: list[str] = []
    started = False
    quote: str | None = None
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if quote is None and c.isspace():
            if started:
                words.append("".join(current))
                current, started = [], False
            i += 1
        elif quote is None and c in "\"'":
            quote, started = c, True
            i += 1
        elif quote is not None and c == quote:
            quote = None
            i += 1
        elif c == "\\" and i + 1 < n:
            current.append(_C_ESCAPES.get(value[i + 1], value[i + 1]))
            started, i = True, i + 2
        elif c == "%" and i + 1 < n:
            current.append(_specifier(value[i + 1], unit=unit, what=what))
            started, i = True, i + 2
        elif c == "$" and env is not None:
            match = _VAR.match(value, i + 1)
            if value.startswith("$$", i):
                current.append("$")
                i += 2
            elif value.startswith("${", i):
                end = value.find("}", i)
                name = value[i + 2 : end] if end > 0 else ""
                if not _VAR.fullmatch(name):
                    raise ConfigError(f"unit {unit}: cannot read {value[i:]!r} in {what}=")
                current.append(env.get(name, ""))
                i = end + 1
            elif (
                match is not None
                and not started
                and (match.end() == n or value[match.end()].isspace())
            ):
                words += env.get(match.group(0), "").split()  # $VAR alone: split at spaces
                i = match.end()
                continue
            else:
                current.append("$")
                i += 1
            started = True
        else:
            current.append(c)
            started, i = True, i + 1
    if quote is not None:
        raise ConfigError(f"unit {unit}: unbalanced quote in {what}={value}")
    if started:
        words.append("".join(current))
    return words


def _specifier(c: str, *, unit: str, what: str) -> str:
    if c == "%":
        return "%"
    if c == "n":
        return unit
    if c == "N":
        return unit.rsplit(".", 1)[0]
    raise ConfigError(
        f"unit {unit}: {what}= uses the specifier %{c}, whose value belongs to the host "
        "(systemd.unit(5)): write the value itself in the command to import it"
    )


def parse_env_file(text: str, *, path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of an ``EnvironmentFile=`` (comments, quotes, continuations)."""
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _VAR.fullmatch(key):
            raise ConfigError(f"{path}: cannot read line {raw.strip()!r} (expected KEY=VALUE)")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            if raw.strip().partition("=")[2].strip().startswith('"'):
                value = re.sub(r"\\(.)", r"\1", value)
        out[key] = value
    return out


def unit_environment(
    settings: UnitSettings, files: dict[str, str | None]
) -> tuple[dict[str, str], dict[str, str]]:
    """(environment, variable -> EnvironmentFile it came from) of the unit: Environment=
    first, the files over it in order (systemd.exec(5))."""
    env: dict[str, str] = {}
    origin: dict[str, str] = {}
    for value in settings.environment:
        for word in split_words(value, unit=settings.unit, env=None, what="Environment"):
            key, sep, val = word.partition("=")
            if not sep or not _VAR.fullmatch(key):
                raise ConfigError(f"unit {settings.unit}: cannot read Environment= word {word!r}")
            env[key] = val
            origin.pop(key, None)
    for entry in settings.environment_files:
        optional = entry.startswith("-")
        path = entry.lstrip("-").strip()
        text = files.get(path)
        if text is None:
            if optional:
                continue
            raise ConfigError(
                f"unit {settings.unit}: EnvironmentFile={path} does not exist (without '-' "
                "systemd fails to start the unit too)"
            )
        for key, value in parse_env_file(text, path=path).items():
            env[key] = value
            origin[key] = f"EnvironmentFile={path}"
    return env, origin


def exec_argv(settings: UnitSettings, env: dict[str, str]) -> list[str]:
    """The unit's one ``ExecStart=`` command as argv (prefixes read, variables substituted)."""
    if len(settings.exec_start) != 1:
        raise ConfigError(
            f"unit {settings.unit}: {len(settings.exec_start)} ExecStart= commands: a service "
            "autotune runs has exactly one"
        )
    value = settings.exec_start[0]
    expand = True
    while value and value[0] in "-@:+!":
        if value[0] == "@":
            raise ConfigError(
                f"unit {settings.unit}: ExecStart=@ gives the program another argv[0], which a "
                "deployment cannot express"
            )
        expand = expand and value[0] != ":"
        value = value[1:]
    argv = split_words(value, unit=settings.unit, env=env if expand else None, what="ExecStart")
    if not argv:
        raise ConfigError(f"unit {settings.unit}: ExecStart= is empty")
    return argv


def raw_service(
    settings: UnitSettings,
    files: dict[str, str | None],
    *,
    origin: str,
    manager: str,
    host: tuple[str, HostSpec] | None = None,
) -> RawService:
    env, env_origin = unit_environment(settings, files)
    argv = exec_argv(settings, env)
    unit_dir = None
    if settings.files:
        unit_dir = posixpath.dirname(settings.files[0])
        if unit_dir in _DEFAULT_UNIT_DIRS:
            unit_dir = "/etc/systemd/system"
    raw = RawService(
        origin=origin,
        argv=argv,
        env=env,
        env_origin=env_origin,
        workdir=settings.working_directory,
        host=host,
        manager="systemd" if manager == "systemd" else "local",
        unit=settings.unit,
        unit_dir=unit_dir,
    )
    raw.notes += [f"{origin}: {item} not imported" for item in settings.ignored]
    return raw


# --------------------------------------------------------------------- reading
def from_unit_file(path: Path) -> RawService:
    """A unit file on this machine, with its drop-ins and environment files."""
    if not path.is_file():
        raise ConfigError(f"{path} is not a file", field="--from-systemd")
    parts = [f"# {path.resolve()}\n" + read_text(path)]
    dropins = path.parent / f"{path.name}.d"
    if dropins.is_dir():
        parts += [f"# {p.resolve()}\n" + read_text(p) for p in sorted(dropins.glob("*.conf"))]
    settings = parse_unit("\n".join(parts), path.name)
    files: dict[str, str | None] = {}
    for entry in settings.environment_files:
        env_path = Path(entry.lstrip("-").strip())
        files[str(env_path)] = read_text(env_path) if env_path.is_file() else None
    installed = str(path.resolve().parent) in _UNIT_DIRS
    raw = raw_service(
        settings,
        files,
        origin=f"systemd unit file {path}",
        manager="systemd" if installed else "local",
    )
    if not installed:
        raw.notes.append(
            f"systemd unit file {path}: not in a systemd unit directory, so autotune runs its "
            "command itself (manager local) instead of restarting the unit"
        )
    return raw


_READ_FILE = 'if [ -e "$1" ]; then cat -- "$1"; else exit 3; fi'


def from_host(host: str, hosts: dict[str, HostSpec], unit: str) -> RawService:
    """``systemctl cat UNIT`` on ``host`` over SSH (through its jump hosts, all in
    ``hosts``), plus its environment files."""
    from autotune.remote.ssh import HostPool

    pool = HostPool(hosts, file="--hosts")
    shell = pool.get(host)
    try:
        result = shell.run(f"systemctl cat -- {shlex.quote(unit)}", timeout_s=60)
        if result.exit_code != 0:
            raise ConfigError(
                f"systemctl cat {unit} on {host} failed ({result.exit_code}): "
                f"{(result.stderr or result.stdout).strip()[-300:]}",
                field="--from-systemd",
            )
        settings = parse_unit(result.stdout, unit)
        files: dict[str, str | None] = {}
        for entry in settings.environment_files:
            path = entry.lstrip("-").strip()
            read = shell.run(
                f"sh -c {shlex.quote(_READ_FILE)} sh {shlex.quote(path)}", timeout_s=60, sudo=True
            )
            if read.exit_code == 3:
                files[path] = None
            elif read.exit_code != 0:
                raise ConfigError(
                    f"cannot read EnvironmentFile={path} of {unit} on {host}: "
                    f"{read.stderr.strip()[-300:]}",
                    field="--from-systemd",
                )
            else:
                files[path] = read.stdout
    finally:
        pool.close_all()
    raw = raw_service(
        settings,
        files,
        origin=f"systemd unit {unit} on {host}",
        manager="systemd",
        host=(host, hosts[host]),
    )
    raw.jump_hosts = {name: spec for name, spec in hosts.items() if name != host}
    return raw
