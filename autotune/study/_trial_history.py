"""What the default sampler (:class:`~autotune.study._local_tpe.LocalTPESampler`) reads of
the study's history: the finished trials, the configurations tried so far (``_Tried``, for
constant-time "tried already?" checks) and the gates of conditional levers (``_gates``:
which lever switches which on, as seen in the trials; ``_active`` drops the levers a
configuration's gates switch off).

Split out of ``autotune/study/samplers.py`` (the public entry point, which re-exports these
names): the local moves, the crash-aware guards and TPE's redraws all read these views.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState


def _finished(study: Study) -> list[FrozenTrial]:
    return study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,), use_cache=True)


class _Tried:
    """The configurations tried so far, for constant-time "tried already?" checks."""

    def __init__(self, configs: Sequence[Mapping[str, Any]]) -> None:
        self._exact = {frozenset(c.items()) for c in configs}
        self._by_keys: dict[frozenset[str], list[Mapping[str, Any]]] = {}
        for c in configs:
            self._by_keys.setdefault(frozenset(c), []).append(c)
        self._projections: dict[tuple[frozenset[str], frozenset[str]], set[frozenset[Any]]] = {}

    def exact(self, params: Mapping[str, Any]) -> bool:
        return frozenset(params.items()) in self._exact

    def covers(self, params: Mapping[str, Any]) -> bool:
        """A tried configuration has every value of ``params`` (and possibly more levers:
        the ones a move switches on are drawn later, so any value of them counts)."""
        items = frozenset(params.items())
        if items in self._exact:
            return True
        keys = frozenset(params)
        for group, configs in self._by_keys.items():
            if not group > keys:
                continue
            seen = self._projections.get((group, keys))
            if seen is None:
                seen = {frozenset((k, c[k]) for k in keys) for c in configs}
                self._projections[(group, keys)] = seen
            if items in seen:
                return True
        return False


def _tried(study: Study, trial: FrozenTrial) -> _Tried:
    """Every finished or running trial but this one (parallel workers), as of this trial's
    ``ask`` (Optuna's per-trial cache: one storage read per trial for the whole sampler)."""
    states = (TrialState.COMPLETE, TrialState.RUNNING)
    trials = study._get_trials(deepcopy=False, states=states, use_cache=True)
    return _Tried([t.params for t in trials if t.number != trial.number and t.params])


Gates = dict[str, tuple[str, frozenset[Any]]]


def _gates(trials: list[FrozenTrial]) -> Gates:
    """Which lever switches each conditional lever on, as seen in the trials: ``p`` is
    present exactly when ``q`` takes one of some values (``speculative_num_steps`` when
    ``speculative`` is ``eagle``). Levers whose presence follows no single lever are left out.

    A lever ``q`` seen only in trials that have ``p`` too (two levers that always come
    together, such as vLLM's CUDA-graph mode and capture size, both on when compilation is)
    says nothing about what switches ``p`` on: it is taken only when no lever seen off does,
    and never back into a cycle. Two such levers gating each other kept both alive in
    ``_active`` after their real gate switched off, so the local move ``--enforce-eager``
    never looked tried and was proposed six times in a row (the MoE study on the H100,
    2026-12-05: #10, #11, #13-#16).
    """
    seen = [t.params for t in trials if t.params]
    names = sorted({n for p in seen for n in p})
    return infer_gates(seen, names, names)


def infer_gates(
    seen: Sequence[Mapping[str, Any]], levers: Sequence[str], gate_levers: Sequence[str]
) -> Gates:
    """:func:`_gates` over the configurations ``seen``: a gate for each of ``levers`` that is
    sometimes absent, chosen among ``gate_levers`` (in their order)."""
    gates: Gates = {}
    vacuous: dict[str, list[tuple[str, frozenset[Any]]]] = {}
    for p in levers:
        if all(p in params for params in seen):
            continue
        for q in gate_levers:
            if q == p:
                continue
            if any(q not in params for params in seen if p in params):
                continue
            on = frozenset(params[q] for params in seen if p in params)
            if not all((params[q] in on) == (p in params) for params in seen if q in params):
                continue
            if all(p in params for params in seen if q in params):  # never seen off
                vacuous.setdefault(p, []).append((q, on))
                continue
            gates[p] = (q, on)
            break
    for p, candidates in vacuous.items():
        if p in gates:
            continue
        for q, on in candidates:
            if not _leads_to(q, p, gates):
                gates[p] = (q, on)
                break
    return gates


def _leads_to(q: str, p: str, gates: Gates) -> bool:
    """Following the gates from ``q`` (what switches ``q`` on, then that lever's gate...)
    reaches ``p``."""
    visited: set[str] = set()
    while q in gates and q not in visited:
        visited.add(q)
        q = gates[q][0]
        if q == p:
            return True
    return False


def _active(params: Mapping[str, Any], gates: Gates) -> dict[str, Any]:
    """``params`` without the levers that its gates switch off."""
    out = dict(params)
    for _ in range(len(gates)):
        changed = False
        for p, (q, on) in gates.items():
            if p in out and (q not in out or out[q] not in on):
                del out[p]
                changed = True
        if not changed:
            break
    return out
