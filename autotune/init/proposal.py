"""The proposed space: the catalog's levers around what each service runs today.

For every lever of the service's engine that applies (:func:`autotune.init.catalog.applies`)
one parameter, whose baseline is exactly today's setting and whose other values are the
catalog's candidates or a range around today's value:

* a flag given today with a number: a range around it (int: value/factor .. value*factor on a
  log scale; float: +- spread on a 0.01 grid); with a word: that word among the candidates;
* a flag not given today: ``default`` (leave it out: the engine's own value) among the
  candidates, so the baseline renders without it;
* a switch: present or not; an on/off pair (``--enable-x``/``--no-enable-x``): ``default``,
  ``on``, ``off``, in the spelling the command uses;
* a variable: its value today (or ``unset``) among the candidates;
* a ``map`` lever (several flags at once): the choice whose flags the command has, or a
  ``current`` choice holding exactly what it has.

Services of one engine whose setting of a lever is the same share one parameter (a prefill
and a decode server tune ``--mem-fraction-static`` together, as the bundled space does);
different settings give a parameter per service (``mem_fraction_static_decode``). A value is
never formatted differently from today's: where the text is not what the space would render
(``0.90``), the choices carry the text itself.

Recipes (:class:`autotune.init.catalog.Recipe`) whose model pattern matches become an
``enqueue:`` entry of the study, tried right after the baseline, with their source.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.init.catalog import (
    Lever,
    Recipe,
    allowed_candidates,
    applies,
    levers_for,
    load_catalog,
)
from autotune.init.model import ImportedService
from autotune.init.options import REFERENCE
from autotune.space.targets import format_value

Scalar = bool | int | float | str


@dataclass
class Proposed:
    """What the space and the study files get."""

    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline: dict[str, Scalar] = field(default_factory=dict)
    levers: dict[str, list[str]] = field(default_factory=dict)
    """Catalog lever -> the parameters made from it."""
    enqueue: list[tuple[dict[str, Scalar], Recipe]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    """``service: lever`` -> why it is not proposed (the interesting reasons only)."""

    @property
    def services(self) -> list[str]:
        seen: list[str] = []
        for spec in self.params.values():
            for service in spec["services"]:
                if service not in seen:
                    seen.append(service)
        return seen


@dataclass(frozen=True)
class _Shape:
    spec: dict[str, Any]
    baseline: Scalar

    def key(self) -> str:
        return json.dumps([self.spec, self.baseline], sort_keys=True, default=str)


def propose(services: list[ImportedService]) -> Proposed:
    """The space's parameters for ``services`` (see the module docstring)."""
    out = Proposed()
    order: list[str] = []
    shapes: dict[str, dict[str, tuple[_Shape, list[str], Lever]]] = {}
    for service in services:
        for lever in levers_for(service.engine.name):
            why = applies(lever, service)
            if why is None:
                shape = _shape(lever, service)
                if isinstance(shape, str):
                    why = shape
                else:
                    if lever.name not in shapes:
                        shapes[lever.name] = {}
                        order.append(lever.name)
                    key = shape.key()
                    entry = shapes[lever.name].setdefault(key, (shape, [], lever))
                    entry[1].append(service.name)
                    continue
            if not why.startswith(("not on", "not for", "needs several", "does not exist")):
                out.left_out[f"{service.name}: {lever.name}"] = why
    for lever_name in order:
        groups = list(shapes[lever_name].values())
        for shape, names, lever in groups:
            name = lever_name if len(groups) == 1 else f"{lever_name}_{names[0]}"
            name = re.sub(r"[^A-Za-z0-9_]", "_", name)
            spec = {**shape.spec, "services": names}
            spec["description"] = _description(lever)
            out.params[name] = spec
            out.baseline[name] = shape.baseline
            out.levers.setdefault(lever_name, []).append(name)
    _recipes(services, out)
    return out


def _description(lever: Lever) -> str:
    return f"{' '.join(lever.why.split())} Source: {' '.join(lever.cite.split())}."


def _shape(lever: Lever, service: ImportedService) -> _Shape | str:
    """The parameter ``lever`` makes on ``service``, or why it makes none."""
    if lever.kind == "env":
        return _env(lever, service)
    if lever.kind == "map":
        return _map(lever, service)
    flag = lever.flag or ""
    if service.count(flag) > 1:
        return f"{flag} is given more than once"
    option = service.option(flag)
    if option is not None and any(REFERENCE.fullmatch(v) for v in option.values):
        return f"{flag} carries a credential"
    if lever.kind == "bool":
        return _bool(lever, service)
    text = option.text if option is not None else None
    candidates = allowed_candidates(lever, service)
    if text is None:
        return _unset_choices(lever, flag, candidates)
    if lever.kind == "int" and text.isdigit() and str(int(text)) == text:
        return _int_range(lever, flag, int(text))
    if lever.kind == "float":
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and format_value(value) == text:
            return _float_range(lever, flag, value)
    return _given_choice(flag, text, candidates, lever)


def _sentinel(values: Sequence[Scalar], word: str = "default") -> str:
    return word if word not in {str(v) for v in values} else f"{word}_"


def _unset_choices(lever: Lever, flag: str, candidates: list[Scalar]) -> _Shape | str:
    if not candidates:
        return "no value to offer"
    unset = _sentinel(candidates)
    spec: dict[str, Any] = {
        "type": "categorical",
        "choices": [unset, *candidates],
        "target": {"flag": flag, "unset_value": unset},
    }
    return _Shape(spec, unset)


def _given_choice(flag: str, text: str, candidates: list[Scalar], lever: Lever) -> _Shape | str:
    """Today's word among the candidates (as the space would render it, or its own text)."""
    today: Scalar = next((c for c in candidates if _rendered(c) == text), text)
    choices = list(candidates) if today in candidates else [today, *candidates]
    if len(choices) < 2:
        return "no other value to offer"
    spec: dict[str, Any] = {"type": "categorical", "choices": choices, "target": {"flag": flag}}
    if lever.default is not None and lever.default in choices:
        spec["default"] = lever.default
    return _Shape(spec, today)


def _rendered(value: Scalar) -> str:
    return format_value(value)


def _int_range(lever: Lever, flag: str, value: int) -> _Shape | str:
    low = max(int(lever.min if lever.min is not None else 1), math.floor(value / lever.factor))
    high = math.ceil(value * lever.factor)
    if lever.max is not None:
        high = min(int(lever.max), high)
    low, high = min(low, value), max(high, value)
    if low >= high:
        return "no range around today's value"
    spec: dict[str, Any] = {"type": "int", "low": low, "high": high}
    if low >= 1:
        spec["log"] = True
    spec["target"] = {"flag": flag}
    return _Shape(spec, value)


def _float_range(lever: Lever, flag: str, value: float) -> _Shape | str:
    low = value - lever.spread if lever.min is None else max(lever.min, value - lever.spread)
    high = value + lever.spread if lever.max is None else min(lever.max, value + lever.spread)
    low, high = min(low, value), max(high, value)
    spec: dict[str, Any] = {"type": "float"}
    if abs(value * 100 - round(value * 100)) < 1e-9:
        spec.update(low=round(math.floor(low * 100 + 1e-9) / 100, 2))
        spec.update(high=round(math.ceil(high * 100 - 1e-9) / 100, 2), step=0.01)
        if not spec["low"] <= value <= spec["high"]:  # pragma: no cover - rounding guard
            return "no range around today's value"
    else:
        spec.update(low=low, high=high)
    if spec["low"] >= spec["high"]:
        return "no range around today's value"
    spec["target"] = {"flag": flag}
    return _Shape(spec, value)


def _bool(lever: Lever, service: ImportedService) -> _Shape | str:
    flag = lever.flag or ""
    manifest = service.engine.manifest
    info = manifest.option(flag) if manifest is not None else None
    option = service.option(flag)
    others = [f for f in (info.flags if info else ()) if f != flag and f.startswith("--")]
    if not others:  # a switch: present or not
        spec = {"type": "bool", "default": False, "target": {"switch": flag}}
        return _Shape(spec, option is not None)
    off = f"--no-{flag[2:]}" if f"--no-{flag[2:]}" in others else others[0]
    if option is not None and option.flag != flag:
        off = option.flag  # the spelling the command uses
    today = "default" if option is None else ("on" if option.flag == flag else "off")
    spec = {
        "type": "categorical",
        "choices": ["default", "on", "off"],
        "target": {"map": {"default": {}, "on": {"switches": [flag]}, "off": {"switches": [off]}}},
    }
    return _Shape(spec, today)


def _env(lever: Lever, service: ImportedService) -> _Shape | str:
    var = lever.env or ""
    raw = service.raw
    if raw.manager == "systemd" and raw.env_origin.get(var, "").startswith("EnvironmentFile"):
        # systemd.exec(5): EnvironmentFile= overrides Environment=, the drop-in's included.
        return (
            f"{var} comes from an EnvironmentFile= of unit {raw.unit}, which systemd applies "
            "over autotune's drop-in: edit that file to tune it"
        )
    current = service.env.get(var)
    if current is not None and REFERENCE.search(current):
        return f"{var} carries a credential"
    candidates = [str(c) for c in lever.candidates]
    unset = _sentinel(candidates, "unset")
    choices: list[Scalar] = [unset, *candidates]
    if current is not None and current not in choices:
        choices.append(current)
    spec: dict[str, Any] = {
        "type": "categorical",
        "choices": choices,
        "target": {"env": var, "unset_value": unset},
    }
    if lever.default is not None and str(lever.default) in choices:
        spec["default"] = str(lever.default)
    return _Shape(spec, current if current is not None else unset)


def _map(lever: Lever, service: ImportedService) -> _Shape | str:
    owned = lever.owned_flags()
    have: dict[str, str] = {}
    switches: list[str] = []
    for flag in owned:
        if service.count(flag) > 1:
            return f"{flag} is given more than once"
        option = service.option(flag)
        if option is None:
            continue
        if option.values:
            have[flag] = option.text
        else:
            switches.append(flag)
    entries: dict[str, dict[str, Any]] = {}
    today: str | None = None
    for name, choice in lever.choices.items():
        entry: dict[str, Any] = {}
        if choice.flags:
            entry["flags"] = dict(choice.flags)
        if choice.switches:
            entry["switches"] = list(choice.switches)
        entries[name] = entry
        flags = {f: format_value(v) for f, v in choice.flags.items()}
        if flags == have and sorted(choice.switches) == sorted(switches):
            today = name
    if today is None:
        current: dict[str, Any] = {}
        if have:
            current["flags"] = dict(have)
        if switches:
            current["switches"] = switches
        today = _sentinel(list(entries), "current")
        entries = {today: current, **entries}
    spec = {"type": "categorical", "choices": list(entries), "target": {"map": entries}}
    return _Shape(spec, today)


def _recipes(services: list[ImportedService], out: Proposed) -> None:
    """The engines' published settings for these models, as study ``enqueue:`` entries."""
    seen: set[str] = set()
    for service in services:
        model = service.model_path() or ""
        for recipe in load_catalog(service.engine.name).recipes:
            if recipe.name in seen or not re.search(recipe.models, model, re.IGNORECASE):
                continue
            seen.add(recipe.name)
            changes, missing = _recipe_changes(recipe, out)
            if missing:
                out.notes.append(f"recipe {recipe.name} ({recipe.cite}) not enqueued: {missing}")
            elif not changes:
                out.notes.append(f"recipe {recipe.name}: the deployment already runs it")
            else:
                out.enqueue.append((changes, recipe))


def _recipe_changes(recipe: Recipe, out: Proposed) -> tuple[dict[str, Scalar], str]:
    changes: dict[str, Scalar] = {}
    for lever, value in recipe.set.items():
        params = out.levers.get(lever)
        if not params:
            return {}, f"lever {lever} is not proposed for this deployment"
        for param in params:
            wanted = _recipe_value(out.params[param], value)
            if wanted is None:
                return {}, f"{value!r} is not a value of parameter {param}"
            if wanted != out.baseline[param]:
                changes[param] = wanted
    return changes, ""


def _recipe_value(spec: dict[str, Any], value: Scalar) -> Scalar | None:
    """``value`` as the parameter spells it (a bool lever's on/off pair: on/off)."""
    if "choices" in spec:
        choices = spec["choices"]
        if isinstance(value, bool) and "on" in choices:
            return "on" if value else "off"
        for choice in choices:
            if choice == value and type(choice) is type(value):
                return choice
        return None
    if spec["type"] == "bool":
        return value if isinstance(value, bool) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value if spec["low"] <= value <= spec["high"] else None
    return None
