"""The default sampler's crash awareness: which trials failed, why (``_causes``), the
signatures of failure causes (what every trial that failed one way had in common, and no
other trial had), crash patterns (the changes from the incumbent that made a nearby trial
infeasible, ``_repeats``) and changes seen to fail nearby (``_change_failed_nearby``).

Split out of ``autotune/study/samplers.py`` (the public entry point, which re-exports these
names): pure functions of the finished trials, used by
:class:`~autotune.study._local_tpe.LocalTPESampler` to skip local moves and redraw TPE
proposals that would repeat a known failure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial

from autotune.failures import Failure
from autotune.results import feasible

NEAR_FAILURE_LEVERS = 2
"""How many other levers away the evidence that a change fails may be."""
RULE_NAME = re.compile(r"(?:^|; )([A-Za-z0-9_.-]+): ")
"""Rule names in the runner's reason for a forbidden trial (``name: why; name: why``)."""
CRASH_PATTERN_LEVERS = 3
"""An infeasible trial that differs from the incumbent in at most this many levers defines a
crash pattern (the change that broke it) that local moves do not repeat."""


def _failed_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of the infeasible trials (read once: constraints are parsed on each access)."""
    return {t.number for t in trials if not feasible(t)}


def _causes(trial: FrozenTrial) -> list[str]:
    """Why an infeasible trial failed: its failure class, or each forbidden rule it broke
    (user attribute ``violations`` when stored, else the names in the runner's reason,
    ``name: why; name: why``)."""
    failure = trial.user_attrs.get("failure")
    if not failure:
        return ["infeasible"]
    if failure == Failure.forbidden:
        rules = trial.user_attrs.get("violations")
        if not isinstance(rules, list):
            rules = RULE_NAME.findall(str(trial.user_attrs.get("reason") or ""))
        return [f"forbidden:{r}" for r in rules] or ["forbidden"]
    return [str(failure)]


Signature = tuple[dict[str, Any], list[tuple[str, str]]]
"""Lever values and orderings (``a > b``) that a failure cause needs."""


def _failure_signatures(trials: list[FrozenTrial], failed: set[int]) -> list[Signature]:
    """What every trial that failed for one cause has, and no trial of another outcome has.

    Two or more trials broke the same forbidden rule or crashed the same way: the lever
    values they share, and the orderings of two numeric levers they share (``min > max``),
    contain the cause (``moe_runner_backend=flashinfer_cutlass`` with ``checkpoint=mxfp4``).
    Any part that a trial of another outcome also has explains nothing and is dropped, so
    a signature never covers a configuration already seen to work.
    """
    groups: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        if t.params and t.number in failed:
            for cause in _causes(t):
                groups.setdefault(cause, []).append(t)
    signatures: list[Signature] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        ids = {t.number for t in members}
        others = [t for t in trials if t.number not in ids]
        common = dict(members[0].params)
        for t in members[1:]:
            common = {k: v for k, v in common.items() if k in t.params and t.params[k] == v}
        if common and not any(_matches(t.params, (common, [])) for t in others):
            signatures.append((common, []))
        numeric = [
            name
            for name, dist in members[0].distributions.items()
            if isinstance(dist, (IntDistribution, FloatDistribution))
            and all(name in t.params for t in members)
        ]
        for a in numeric:
            for b in numeric:
                if a == b or not all(t.params[a] > t.params[b] for t in members):
                    continue
                if not any(_matches(t.params, ({}, [(a, b)])) for t in others):
                    signatures.append(({}, [(a, b)]))
    return signatures


def _matches(params: Mapping[str, Any], signature: Signature) -> bool:
    values, orders = signature
    return all(name in params and params[name] == v for name, v in values.items()) and all(
        a in params and b in params and params[a] > params[b] for a, b in orders
    )


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    return sum(a.get(k) != b.get(k) for k in a.keys() | b.keys())


def _change_failed_nearby(
    params: Mapping[str, Any], changed: Sequence[str], trials: list[FrozenTrial], failed: set[int]
) -> bool:
    """Among the tried configurations with the same new values of the ``changed`` levers,
    the closest (at most two other levers away) all failed: the change is known to crash
    or to be refused in this neighbourhood (fp16 accumulation without split-K, a bigger
    tile past the shared memory), whichever incumbent it is made from."""
    nearest = NEAR_FAILURE_LEVERS + 1
    all_failed = False
    for t in trials:
        if not t.params or any(t.params.get(k) != params.get(k) for k in changed):
            continue
        d = _distance(params, t.params)
        if d < nearest:
            nearest, all_failed = d, t.number in failed
        elif d == nearest:
            all_failed = all_failed and t.number in failed
    return all_failed


def _crash_patterns(
    best: FrozenTrial, trials: list[FrozenTrial], failed: set[int]
) -> list[dict[str, Any]]:
    """The changes from ``best`` that made a nearby trial infeasible (crash or forbidden)."""
    patterns = []
    for t in trials:
        if t.number not in failed or not t.params:
            continue
        diff = {
            name: t.params.get(name)
            for name in set(t.params) | set(best.params)
            if t.params.get(name) != best.params.get(name)
        }
        if 0 < len(diff) <= CRASH_PATTERN_LEVERS:
            patterns.append(diff)
    return patterns


def _repeats(
    params: Mapping[str, Any],
    base: Mapping[str, Any],
    pattern: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
) -> bool:
    """``params`` makes the change ``pattern`` made from ``base`` (numeric levers: moved at
    least as far in the same direction, since crash regions such as OOM grow monotonically
    with memory fraction, graph batch or speculative depth)."""
    for name, bad in pattern.items():
        value = params.get(name)
        dist = distributions.get(name)
        if bad is None or value is None or name not in base:
            if value != bad:
                return False
            continue
        if isinstance(dist, (IntDistribution, FloatDistribution)):
            start = dist.to_internal_repr(base[name])
            step = float(dist.to_internal_repr(bad)) - start
            moved = float(dist.to_internal_repr(value)) - start
            if step == 0 or moved * step <= 0 or abs(moved) < abs(step) * (1 - 1e-9):
                return False
        elif value != bad:
            return False
    return True
