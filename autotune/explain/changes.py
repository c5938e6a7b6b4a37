"""What the winner changed from the baseline, and the configurations in between.

A *change* is the unit the explanation reverts and adds: usually one lever. A lever the
baseline leaves inactive (``when:`` false there) is reverted to the engine's own value (the
space's ``default:``, or its flag's ``unset_value``) where the space gives one; a winner
whose value equals that default, or that leaves the lever inactive too, changed nothing
there and is no change. Without a default there is nothing to go back to, and a baseline
lever the winner made inactive comes back by itself when its parent is reverted: either is
grouped with the changed levers its condition names (transitively, through derived values),
and the group is reverted and added as one.

:meth:`ChangeSet.variant` builds "the baseline plus these changes": a configuration, or why
there is none (a forbidden combination, a lever the mix activates that neither side sets).
Pure functions of the space: no Optuna, no servers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autotune.errors import ConfigError
from autotune.space import SearchSpace
from autotune.space.expr import same_value

Config = dict[str, object]


@dataclass(frozen=True)
class Change:
    """One revertible unit: the levers that change together."""

    levers: tuple[str, ...]
    """In the space's declaration order; the first is the one that carries the others."""
    winner: Mapping[str, object]
    """The winner's value of each lever (a lever the winner leaves inactive is absent)."""
    baseline: Mapping[str, object]
    """What each lever is reverted to: the baseline's value, or the engine's default for a
    lever the baseline leaves inactive (:attr:`defaulted`); absent where there is neither."""
    why_grouped: str | None = None
    defaulted: tuple[str, ...] = ()
    """Levers inactive in the baseline, reverted to the engine's default."""

    @property
    def name(self) -> str:
        return " + ".join(self.levers)

    def describe(self) -> str:
        """``lever: baseline -> winner`` for each lever, inactive written as such."""

        def shown(values: Mapping[str, object], lever: str) -> str:
            if lever not in values:
                return "(inactive)"
            return repr(values[lever]) + (
                " (default)" if values is self.baseline and lever in self.defaulted else ""
            )

        return ", ".join(
            f"{lever}: {shown(self.baseline, lever)} -> {shown(self.winner, lever)}"
            for lever in self.levers
        )


@dataclass(frozen=True)
class Variant:
    """The baseline with some changes applied: a configuration, or why there is none."""

    applied: frozenset[str]
    """Names of the changes applied (:attr:`Change.name`)."""
    config: Config | None
    key: str | None
    refused: str | None = None
    """Why the combination cannot run (forbidden rule, missing value); None when it can."""


class ChangeSet:
    """The changes from ``baseline`` to ``winner`` in ``space`` (both sampled values)."""

    def __init__(
        self, space: SearchSpace, *, baseline: Mapping[str, object], winner: Mapping[str, object]
    ) -> None:
        self.space = space
        self.baseline_config = space.complete(baseline)
        self.winner_config = space.complete(winner)
        self.defaults = {
            p.name: d for p in space.sampled_params if (d := p.engine_default) is not None
        }
        self.changes: tuple[Change, ...] = _group(
            space, self.baseline_config, self.winner_config, self.defaults
        )
        self._by_name = {c.name: c for c in self.changes}
        self._owner = {lever: c.name for c in self.changes for lever in c.levers}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.changes)

    def change(self, name: str) -> Change:
        return self._by_name[name]

    def variant(self, applied: Iterable[str]) -> Variant:
        """The baseline plus the changes named in ``applied`` (the rest stay at the baseline)."""
        names = frozenset(applied)
        unknown = names - self._by_name.keys()
        if unknown:
            raise KeyError(sorted(unknown)[0])
        # Each lever: the winner's value where its change is applied, else the baseline's,
        # else the engine's default, else (a lever only this mix activates) the winner's.
        values: Config = {}
        for param in self.space.sampled_params:
            lever = param.name
            owner = self._owner.get(lever)
            if owner in names and lever in self.winner_config:
                values[lever] = self.winner_config[lever]
            elif owner in names:
                continue  # the winner leaves it inactive
            elif lever in self.baseline_config:
                values[lever] = self.baseline_config[lever]
            elif lever in self.defaults:
                values[lever] = self.defaults[lever]
            elif lever in self.winner_config:
                values[lever] = self.winner_config[lever]
        try:
            config = self.space.complete(values)
        except ConfigError as exc:
            return Variant(names, None, None, refused=exc.message)
        hits = self.space.violations(config)
        if hits:
            rules = "; ".join(str(v) for v in hits)
            return Variant(names, None, None, refused=f"forbidden combination ({rules})")
        return Variant(names, dict(config), self.space.config_key(config))

    def without(self, removed: Iterable[str]) -> Variant:
        """The winner with the changes in ``removed`` reverted to the baseline."""
        gone = set(removed)
        return self.variant(n for n in self.names if n not in gone)

    def revert_alone(self, name: str) -> tuple[Variant, tuple[str, ...], str | None]:
        """The winner without ``name``: (variant, the changes reverted, what was done).

        A revert that is forbidden on its own is tried together with each other change in
        turn (declaration order); the first that runs is taken and said. With none, the
        refused variant is returned.
        """
        alone = self.without([name])
        if alone.config is not None:
            return alone, (name,), None
        for other in self.names:
            if other == name:
                continue
            pair = self.without([name, other])
            if pair.config is not None:
                return (
                    pair,
                    (name, other),
                    f"reverting {name} alone is refused ({alone.refused}); reverted together "
                    f"with {other}",
                )
        return alone, (name,), f"cannot be reverted: {alone.refused}"


def _group(
    space: SearchSpace,
    base: Mapping[str, object],
    win: Mapping[str, object],
    defaults: Mapping[str, object],
) -> tuple[Change, ...]:
    sampled = list(space.sampled_params)
    # What each lever goes back to: the baseline's value, else the engine's default (for a
    # lever the winner sets: inactive on both sides, it is the engine's value on both).
    back = {**{n: v for n, v in defaults.items() if n not in base and n in win}, **base}
    changed = [
        p.name
        for p in sampled
        if (p.name in back) != (p.name in win)
        or (p.name in win and not same_value(back[p.name], win[p.name]))
    ]
    parent = {name: name for name in changed}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def sources(names: Iterable[str], seen: frozenset[str] = frozenset()) -> set[str]:
        """The sampled levers behind ``names`` (derived values expanded: what they are
        computed from and what their own ``when`` reads, since either decides whether they
        exist)."""
        out: set[str] = set()
        for name in names:
            if name in seen:
                continue
            try:
                param = space.parameter(name)
            except ConfigError:
                continue
            if param.sampled:
                out.add(name)
            elif param.derived is not None:
                behind = param.derived.names | (param.when.names if param.when else frozenset())
                out |= sources(behind, seen | {name})
        return out

    why: dict[str, str] = {}
    for name in changed:
        param = space.parameter(name)
        if (name in back) == (name in win) or param.when is None:
            continue
        side = "the baseline (and has no default)" if name not in back else "the winner"
        # It goes with the nearest changed lever its condition names (the last declared:
        # conditions name earlier levers), whose revert makes it inactive (or active) too.
        named = sources(param.when.names) & set(changed)
        if named:
            other = max(named, key=lambda n: space.parameter(n).index)
            a, b = find(name), find(other)
            if a != b:
                parent[a] = b
            why[name] = f"{name} is inactive in {side} (when: {param.when.source})"
    groups: dict[str, list[str]] = {}
    for name in changed:
        groups.setdefault(find(name), []).append(name)
    order = {p.name: i for i, p in enumerate(sampled)}
    out = []
    for members in sorted(groups.values(), key=lambda m: min(order[n] for n in m)):
        levers = tuple(sorted(members, key=order.__getitem__))
        notes = [why[n] for n in levers if n in why]
        out.append(
            Change(
                levers=levers,
                winner={n: win[n] for n in levers if n in win},
                baseline={n: back[n] for n in levers if n in back},
                why_grouped="; ".join(notes) or None,
                defaulted=tuple(n for n in levers if n in back and n not in base),
            )
        )
    return tuple(out)
