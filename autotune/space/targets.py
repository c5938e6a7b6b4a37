"""Turning a parameter value into flags and environment variables of one service.

A parameter *owns* every flag and variable its target mentions. When the parameter is
active, its value decides them; when it is inactive (its ``when`` is false), what it owns is
removed from the base command and environment, so the server falls back to its default and
nothing stale from the deployment file survives (``speculative: off`` removes
``--speculative-num-steps`` too).
"""

from __future__ import annotations

from autotune.space.expr import same_value
from autotune.space.model import (
    EnvTarget,
    FlagTarget,
    MapTarget,
    SwitchTarget,
    choice_key,
)
from autotune.space.settings import ServiceSettings

AnyTarget = EnvTarget | FlagTarget | SwitchTarget | MapTarget


def owned_flags(target: AnyTarget) -> set[str]:
    """Flags (with or without value) the target decides."""
    if isinstance(target, FlagTarget):
        return {target.flag}
    if isinstance(target, SwitchTarget):
        return {target.switch}
    if isinstance(target, MapTarget):
        found: set[str] = set()
        for entry in target.map.values():
            found |= set(entry.flags) | set(entry.switches) | set(entry.remove_flags)
        return found
    return set()


def owned_env(target: AnyTarget) -> set[str]:
    """Environment variables the target decides."""
    if isinstance(target, EnvTarget):
        return {target.env}
    if isinstance(target, MapTarget):
        found: set[str] = set()
        for entry in target.map.values():
            found |= set(entry.env) | set(entry.unset_env)
        return found
    return set()


def format_value(value: object, *, float_decimals: int | None = None) -> str:
    """Text of a value on a command line: ``true``/``false``, ``0.88`` (not 0.88000001)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if float_decimals is not None:
            value = round(value, float_decimals)
        return repr(value)
    return str(value)


def apply_inactive(target: AnyTarget, settings: ServiceSettings) -> None:
    """Remove everything the target owns."""
    for flag in owned_flags(target):
        settings.flags.pop(flag, None)
        settings.remove_flags.add(flag)
    for name in owned_env(target):
        settings.env.pop(name, None)
        settings.unset_env.add(name)


def _set_flag(settings: ServiceSettings, flag: str, value: str | tuple[str, ...] | None) -> None:
    settings.flags[flag] = value
    settings.remove_flags.discard(flag)


def _remove_flag(settings: ServiceSettings, flag: str) -> None:
    settings.flags.pop(flag, None)
    settings.remove_flags.add(flag)


def _set_env(settings: ServiceSettings, name: str, value: str) -> None:
    settings.env[name] = value
    settings.unset_env.discard(name)


def _unset_env(settings: ServiceSettings, name: str) -> None:
    settings.env.pop(name, None)
    settings.unset_env.add(name)


def _is_unset(target: EnvTarget | FlagTarget, value: object) -> bool:
    return target.unset_value is not None and same_value(target.unset_value, value)


def apply_value(
    target: AnyTarget,
    value: object,
    settings: ServiceSettings,
    *,
    float_decimals: int | None = None,
) -> None:
    """Write ``value`` through ``target`` into ``settings``.

    ``value`` is already checked against the parameter's domain; a switch receiving a
    non-bool (a derived parameter) raises :class:`TypeError`, a map a value without an
    entry :class:`KeyError`; the caller turns both into ``ConfigError``.
    """
    if isinstance(target, EnvTarget):
        if _is_unset(target, value):
            _unset_env(settings, target.env)
        elif isinstance(value, bool):
            _set_env(settings, target.env, target.true_value if value else target.false_value)
        else:
            _set_env(settings, target.env, format_value(value, float_decimals=float_decimals))
    elif isinstance(target, FlagTarget):
        if _is_unset(target, value):
            _remove_flag(settings, target.flag)
        elif isinstance(value, bool):
            _set_flag(settings, target.flag, target.true_value if value else target.false_value)
        else:
            _set_flag(settings, target.flag, format_value(value, float_decimals=float_decimals))
    elif isinstance(target, SwitchTarget):
        if not isinstance(value, bool):
            raise TypeError(f"a switch needs true/false, got {value!r}")
        if value == target.present_when:
            _set_flag(settings, target.switch, None)
        else:
            _remove_flag(settings, target.switch)
    else:
        entry = target.map[choice_key(value)]
        flags_set = set(entry.flags) | set(entry.switches)
        env_set = set(entry.env)
        for flag in sorted(owned_flags(target) - flags_set):
            _remove_flag(settings, flag)
        for name in sorted(owned_env(target) - env_set):
            _unset_env(settings, name)
        for flag, flag_value in entry.flags.items():
            if isinstance(flag_value, list):
                _set_flag(settings, flag, tuple(format_value(v) for v in flag_value))
            else:
                _set_flag(settings, flag, format_value(flag_value))
        for flag in entry.switches:
            _set_flag(settings, flag, None)
        for name, env_value in entry.env.items():
            _set_env(settings, name, env_value)
