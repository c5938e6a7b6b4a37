"""Measurements an explanation borrows from another study (``autotune explain --runs-from``).

Why: on real hardware a restart costs minutes (two to three for a 7B model on an H200), and a
check study, which measures vLLM's defaults, a hand-picked combination and the winner side by
side from fresh starts with the tuning study's load, has already measured two of the
configurations every explanation needs: the winner and the baseline. Measuring them again
spends restarts on what is known. Borrowing takes those measurements as runs of their
configurations; the planner then measures only what is missing (a configuration with as
many runs as ``repeats`` is not measured again).

What may be borrowed is what the explanation would have measured itself:

* a study measured under the same conditions: the same search space and deployment (the
  files' contents, not their paths), objective, load, SLOs, capacity search and curve
  (checked by :func:`autotune.study.explainer.check_same_conditions`, which knows study
  files: a difference is a ConfigError naming the other study's file and the field, before
  anything is stored);
* from the explained study itself, only when asked (``--own-runs``, ``explain.own_runs``)
  and never a run of the winner's configuration: its trials chose the winner, so the
  winner's own figure is the highest of many noisy ones (selection bias). Another
  configuration's figure is conditioned only on not having won, which matters where it came
  close (a change that bought little loses more often on a low draw, and would look as if it
  bought more); so at most ``repeats - 1`` of its runs are taken, the earliest first (the
  order they were measured in, not their figures), and every configuration keeps at least
  one run the explanation measures itself, in its rounds beside the winner's. On the H200
  the dense study held two exact reverts of its winner (#23, #24): two restarts of fifteen;
* per measurement (a completed trial, or one of its re-measurements ``remeasure:N:R``): run
  to its end (no failure, no early abort), from freshly started services (every service
  restarted; not a result reused from an identical trial, not a trial carried by a warm
  start), by the winner's engine version, with the variables the winner's services
  inherited from autotune's environment (where both recorded them:
  :mod:`autotune.trial.inherited_env`; on an H100, forking vLLM's workers instead of
  spawning them moved one configuration by 16%).

Each borrowed run keeps its origin (``STUDY#N``, ``STUDY#N/R`` for a re-measurement), so
borrowing again adds only what is new. What it cannot share is the round-by-round order of
the explanation's own runs: a borrowed run was measured on another occasion (another machine
of the same kind, another hour), so a drift between occasions falls on the borrowed
configurations only. The explanation says how many runs it borrowed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from autotune.errors import ConfigError, StorageError
from autotune.explain.changes import ChangeSet
from autotune.explain.occasions import lent_by
from autotune.explain.record import ExplainRun
from autotune.results import REMEASURE_PREFIX, carried, feasible
from autotune.space import SearchSpace
from autotune.space.expr import same_value
from autotune.trial.inherited_env import services_changes
from autotune.trial.record import RemeasureRecord, TrialRecord


@dataclass
class Borrowed:
    """What one source study offers: the runs to borrow and why the others were left."""

    source: str
    runs: list[ExplainRun] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        configs = len({r.key for r in self.runs})
        text = (
            f"{len(self.runs)} measurement(s) of {configs} configuration(s) from study "
            f"{self.source!r}"
        )
        if self.skipped:
            left = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            text += f" (not borrowed: {left})"
        return text


def borrowable_runs(
    source: optuna.Study,
    *,
    space: SearchSpace,
    engine_version: Mapping[str, str],
    inherited: Mapping[str, Mapping[str, str] | None] | None = None,
    leave: Leave | None = None,
    per_config: int | None = None,
    held: Mapping[str, int] | None = None,
) -> Borrowed:
    """Every measurement of ``source`` the explanation may take as its own (module doc),
    keyed by this study's ``space``; ``engine_version``: the winner's; ``inherited``: what
    the winner's services inherited (service -> variables, ``None``: not known); ``leave``:
    why a configuration (key, values) is not borrowed, None when it may be; ``per_config``:
    at most this many runs of a configuration, counting ``held`` (runs of it the
    explanation holds from elsewhere), the earliest first (the explained study's own:
    :func:`own_terms`)."""
    name = source.study_name
    out = Borrowed(source=name)
    remeasures = _remeasures(source)
    taken: Counter[str] = Counter()
    held = held or {}

    def over(key: str) -> str | None:
        if per_config is not None and taken[key] + held.get(key, 0) >= per_config:
            return _BEYOND
        taken[key] += 1
        return None

    for trial in source.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if carried(trial):
            out.skipped["carried by a warm start"] += 1
            continue
        record = TrialRecord.from_attrs(
            trial.user_attrs, where=f"study {name}, trial {trial.number}"
        )
        # what rules out every measurement of the configuration, then the trial's own one
        config_why = None
        if engine_version and record.engine_version and record.engine_version != engine_version:
            config_why = "another engine version"
        elif inherited and services_changes(
            inherited, {n: svc.inherited_env for n, svc in record.services.items()}
        ):
            config_why = "another inherited environment"
        try:
            key = space.config_key(record.config)
        except (ConfigError, ValueError, TypeError):
            config_why, key = config_why or "not a configuration of this space", ""
        config_why = config_why or (leave(key, record.config) if leave and key else None)
        why = config_why or _own(record) or over(key)
        if why is not None:
            out.skipped[why] += 1
        else:
            out.runs.append(
                _run(record, key, f"{name}#{trial.number}", list(trial.values or []),
                     feasible(trial), None)
            )  # fmt: skip
        for again in remeasures.get(trial.number, ()):
            why_again = (
                config_why
                or _not_fresh(again.restarted, record)
                or _failed(again)
                or _another_env(inherited, again)
                or over(key)
            )
            if why_again is not None:
                out.skipped[why_again] += 1
                continue
            out.runs.append(
                _run(record, key, f"{name}#{trial.number}/{again.repeat}", again.values,
                     again.feasible, again)
            )  # fmt: skip
    return out


_BEYOND = "beyond repeats - 1 runs of a configuration (one is the explanation's own)"
WINNER_LEFT = "the winner's configuration (its figures chose it)"
UNPLANNED = "not a configuration the explanation measures"

Leave = Callable[[str, Mapping[str, object]], str | None]
"""Why a configuration (its key and values) is not borrowed; None: it may be."""


def own_terms(changes: ChangeSet, repeats: int) -> tuple[Leave, int]:
    """``leave`` and ``per_config`` of :func:`borrowable_runs` for the explained study's own
    trials (module doc): only the configurations the explanation may measure (the baseline
    with some of the winner's ``changes``), not the winner's, at most ``repeats - 1`` runs of
    each (with one run per configuration, none: every run is the explanation's own)."""
    winner = changes.space.config_key(changes.winner_config)

    def leave(key: str, config: Mapping[str, object]) -> str | None:
        if key == winner:
            return WINNER_LEFT
        won = changes.winner_config
        applied = [
            c.name
            for c in changes.changes
            if all(same_value(config.get(lever), won.get(lever)) for lever in c.levers)
        ]
        return None if changes.variant(applied).key == key else UNPLANNED

    return leave, max(repeats - 1, 0)


def without_own_winner(
    runs: dict[str, list[ExplainRun]], study: str, winner_key: str
) -> dict[str, list[ExplainRun]]:
    """``runs`` less those the explained ``study`` lent of ``winner_key``: lent while another
    trial was the winner, they are now the winner's own figures (module doc). Kept in
    storage, left out of what the explanation reads."""
    kept = [r for r in runs.get(winner_key, ()) if not lent_by(r, study)]
    if winner_key in runs and len(kept) != len(runs[winner_key]):
        return {**runs, winner_key: kept}
    return runs


def _remeasures(study: optuna.Study) -> dict[int, list[RemeasureRecord]]:
    out: dict[int, list[RemeasureRecord]] = {}
    for key, raw in study.user_attrs.items():
        if not key.startswith(REMEASURE_PREFIX) or not isinstance(raw, Mapping):
            continue
        try:
            record = RemeasureRecord.model_validate(raw)
        except ValidationError as exc:
            raise StorageError(
                f"study {study.study_name!r}, attribute {key}: not a re-measurement: {exc}"
            ) from exc
        out.setdefault(record.of, []).append(record)
    for records in out.values():
        records.sort(key=lambda r: r.repeat)
    return out


def _own(record: TrialRecord) -> str | None:
    """Why a trial's own measurement is not one an explanation would have taken."""
    if record.failure is not None:
        return "failed"
    if record.reused_from is not None:
        return "reused from an identical trial"
    if record.aborted:
        return "aborted early"
    return _not_fresh(record.restarted, record)


def _not_fresh(restarted: list[str], record: TrialRecord) -> str | None:
    if not record.services or set(record.services) - set(restarted):
        return "not from freshly started services"
    return None


def _another_env(
    inherited: Mapping[str, Mapping[str, str] | None] | None, again: RemeasureRecord
) -> str | None:
    """Why a re-measurement is not borrowed when its own recorded variables (a trial stored
    before they were recorded may have re-measurements that did) differ from the winner's."""
    if inherited and again.inherited_env and services_changes(inherited, again.inherited_env):
        return "another inherited environment"
    return None


def _failed(again: RemeasureRecord) -> str | None:
    if again.failure is not None or not again.values:
        return "failed"
    return None


def _run(
    record: TrialRecord,
    key: str,
    source: str,
    values: list[float],
    feasible_: bool,
    again: RemeasureRecord | None,
) -> ExplainRun:
    """The run of ``record``'s configuration: the trial's own measurement, or its
    re-measurement ``again`` (its figures; the services and versions are the trial's)."""
    measured: TrialRecord | RemeasureRecord = record if again is None else again
    return ExplainRun(
        key=key,
        index=-1,  # set when stored, after the runs of this key already there
        config=record.config,
        values=values,
        feasible=feasible_,
        metrics=measured.metrics,
        services=record.services,
        engine_version=record.engine_version,
        overrides=record.overrides,
        phase_seconds=measured.phase_seconds,
        capacity=measured.capacity,
        telemetry=measured.telemetry,
        source=source,
    )
