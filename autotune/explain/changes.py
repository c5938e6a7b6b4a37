"""What the winner changed from the baseline, and the configurations in between.

A *change* is the unit the explanation reverts and adds: usually one lever, but a lever that
only exists because of another change travels with it. A lever inactive in the baseline
(``when:`` false there) has no baseline value to go back to, and a baseline lever the winner
made inactive comes back by itself when its parent is reverted; either is grouped with the
changed levers its condition names (transitively, through derived values), and the group is
reverted and added as one.

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
    """The baseline's value of each lever (absent where the baseline leaves it inactive)."""
    why_grouped: str | None = None

    @property
    def name(self) -> str:
        return " + ".join(self.levers)

    def describe(self) -> str:
        """``lever: baseline -> winner`` for each lever, inactive written as such."""

        def shown(values: Mapping[str, object], lever: str) -> str:
            return repr(values[lever]) if lever in values else "(inactive)"

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
        self.changes: tuple[Change, ...] = _group(space, self.baseline_config, self.winner_config)
        self._by_name = {c.name: c for c in self.changes}

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
        values: Config = {
            p.name: self.baseline_config[p.name]
            for p in self.space.sampled_params
            if p.name in self.baseline_config
        }
        for name in names:
            change = self._by_name[name]
            for lever in change.levers:
                if lever in change.winner:
                    values[lever] = change.winner[lever]
                else:
                    values.pop(lever, None)
        # A lever the mix makes active that neither side set (its condition holds only for
        # this combination): take the winner's value if it has one.
        for lever, value in self.winner_config.items():
            values.setdefault(lever, value)
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
    space: SearchSpace, base: Mapping[str, object], win: Mapping[str, object]
) -> tuple[Change, ...]:
    sampled = [p for p in space.sampled_params]
    changed = [
        p.name
        for p in sampled
        if (p.name in base) != (p.name in win)
        or (p.name in base and not same_value(base[p.name], win[p.name]))
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
        if (name in base) == (name in win) or param.when is None:
            continue
        side = "the baseline" if name not in base else "the winner"
        for other in sorted(sources(param.when.names) & set(changed)):
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
                baseline={n: base[n] for n in levers if n in base},
                why_grouped="; ".join(notes) or None,
            )
        )
    return tuple(out)
