"""Warm start: a new study begins from what an earlier one learned (``autotune run
--warm-start-from STUDY``, or ``warm_start:`` in the study file).

Before the first trial of a new study, two things come over from the earlier study, each
translated to the new space (:meth:`autotune.space.SearchSpace.translate`: levers that no
longer exist dropped, values no longer allowed replaced by the new baseline's, conditional
levers fixed up), each change said in the run's output:

* its best ``top`` distinct feasible configurations, ranked the way ``autotune best`` ranks
  them (:func:`autotune.results.ranked_estimates`), enqueued right after the baseline and the
  study's own ``enqueue:`` (a translation that hits a forbidden rule of the new space is
  skipped);
* its failed launches (the classes in :data:`autotune.failures.OF_THE_CONFIG`: OOM, crash,
  rejected arguments, wrong output, ...), added as completed, infeasible trials with the
  constraint values the runner writes for a failed launch and the user attribute
  ``warm_start_from`` = ``STUDY#N``, so the default sampler's crash signatures, crash patterns
  and "tried already" checks learn from them at once. Such a trial is carried only when its
  translation kept its meaning: no value replaced, and a lever dropped only where it had the
  earlier baseline's value (a crash may have needed the value that is gone).

Carried trials are evidence, never this study's trials: every reader skips them
(:func:`autotune.results.own_trials`): the trial target, ``best``, the report, ``status``, the
reuse index and the re-measurement. The study attribute ``warm_start`` records what was
done, and a warm start happens once, when the study is new: resuming never repeats it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StorageError
from autotune.failures import OF_THE_CONFIG
from autotune.results import (
    WARM_START_ATTR,
    feasible,
    own_trials,
    ranked_estimates,
)
from autotune.space import SearchSpace, Value
from autotune.study.objectives import Objective
from autotune.study.record import constraint_attrs
from autotune.study.storage import display_url, load_study, open_storage, storage_errors
from autotune.trial.record import TrialRecord

WARM_START_STUDY_ATTR = "warm_start"
"""Study user attribute: what the warm start of this study carried ({study, storage, ...})."""
DEFAULT_TOP = 5


@dataclass(frozen=True)
class Enqueued:
    """A configuration of the earlier study, translated, to be tried early."""

    params: dict[str, Value]
    origin: str
    """``STUDY#N``: the earlier study and its trial."""
    note: str
    """What the run prints about it."""


@dataclass(frozen=True)
class Carried:
    """A failed launch of the earlier study, translated, to be added as a finished trial."""

    params: dict[str, Value]
    origin: str
    failure: str
    reason: str
    deployment: str | None


@dataclass
class WarmStartPlan:
    """Everything a warm start will write, computed (and checked) before anything runs."""

    study: str
    storage: str
    """The earlier study's storage, for display (no password)."""
    top: int
    enqueue: list[Enqueued] = field(default_factory=list)
    carried: list[Carried] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    """What the run prints: each configuration, each translation, what was skipped."""


def open_source(study: str, url: str) -> optuna.Study:
    """The earlier study; :class:`StorageError` naming what is missing."""
    try:
        storage = open_storage(url, create=False)
        with storage_errors(url, f"reading study {study!r}"):
            return load_study(study, storage)
    except StorageError as exc:
        raise StorageError(
            f"cannot warm-start from study {study!r} in {display_url(url)}: {exc}"
        ) from None


def plan_warm_start(
    source: optuna.Study,
    *,
    space: SearchSpace,
    top: int = DEFAULT_TOP,
    storage: str = "",
    enqueued: Sequence[Mapping[str, Any]] = (),
) -> WarmStartPlan:
    """What ``source`` gives a new study over ``space``: its ``top`` configurations and its
    failed launches, translated (module docstring). ``enqueued``: what the new study tries
    first anyway (its baseline, its ``enqueue:``), not enqueued twice. Reads ``source``
    only."""
    name = source.study_name
    plan = WarmStartPlan(study=name, storage=storage, top=top)
    say = plan.messages.append
    first = {space.config_key(params) for params in enqueued}
    keys: set[str] = set()
    ranked = ranked_estimates(source) if top > 0 else []
    for estimate in ranked:
        if len(plan.enqueue) >= top:
            break
        result = estimate.trial
        origin = f"{name}#{result.number}"
        moved = space.translate(result.params)
        changes = "; ".join(moved.notes())
        if moved.violations:
            say(f"warm start: {origin} skipped ({changes})")
            continue
        key = space.config_key(moved.params)
        figure = f"{estimate.mean:,.1f} tok/s"
        if key in keys or key in first:
            said = "the baseline or enqueue: entry" if key in first else "a configuration above"
            say(
                f"warm start: {origin} ({figure}) not enqueued: here it is the same as {said}"
                + (f" ({changes})" if changes else "")
            )
            keys.add(key)
            continue
        keys.add(key)
        note = f"warm start: {origin} ({figure}) enqueued" + (
            f", translated: {changes}" if changes else ""
        )
        say(note)
        plan.enqueue.append(Enqueued(params=moved.params, origin=origin, note=note))
    if top > 0 and not ranked:
        say(f"warm start: {name} has no feasible configuration to start from")

    trials = source.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    baseline = next((t.params for t in own_trials(source) if t.user_attrs.get("is_baseline")), {})
    worked = {space.config_key(space.translate(t.params).params) for t in _feasible(trials)}
    skipped: Counter[str] = Counter()
    for trial in trials:
        failure = trial.user_attrs.get("failure")
        if failure not in OF_THE_CONFIG or trial.user_attrs.get("reused_from") is not None:
            continue
        origin = str(trial.user_attrs.get(WARM_START_ATTR) or f"{name}#{trial.number}")
        moved = space.translate(trial.params)
        lost = {n: v for n, v in moved.dropped.items() if baseline.get(n, _MISSING) != v}
        if moved.replaced or lost:
            skipped["a value it needs is gone or no longer allowed"] += 1
            continue
        key = space.config_key(moved.params)
        if key in keys or key in worked:
            skipped["the same configuration here also worked, or is carried already"] += 1
            continue
        keys.add(key)
        if not moved.unchanged:
            say(
                f"warm start: failed launch {origin} ({failure}) translated: "
                + "; ".join(moved.notes())
            )
        plan.carried.append(
            Carried(
                params=moved.params,
                origin=origin,
                failure=str(failure),
                reason=str(trial.user_attrs.get("reason") or ""),
                deployment=trial.user_attrs.get("deployment"),
            )
        )
    causes = Counter(c.failure for c in plan.carried)
    line = f"warm start: {len(plan.carried)} failed launches of {name} carried as evidence"
    if causes:
        line += " (" + ", ".join(f"{n} {c}" for c, n in causes.most_common()) + ")"
    if skipped:
        line += "; not carried: " + ", ".join(f"{n} ({why})" for why, n in skipped.items())
    say(line + "; they are not trials of this study")
    return plan


_MISSING = object()


def _feasible(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if feasible(t) and t.user_attrs.get("failure") is None]


def apply_warm_start(
    study: optuna.Study,
    plan: WarmStartPlan,
    *,
    space: SearchSpace,
    objective: Objective,
    say: Callable[[str], None] = lambda _: None,
) -> None:
    """Write ``plan`` into the new ``study``: the configurations enqueued (after whatever is
    enqueued already), the failed launches added as finished infeasible trials, and the
    study attribute that records it."""
    for item in plan.enqueue:
        study.enqueue_trial(item.params)
    distributions = space.distributions()
    values = objective.failed_values()
    system_attrs = constraint_attrs(objective.failed_constraints(), objective.constraint_keys)
    for c in plan.carried:
        record = TrialRecord(
            config=dict(space.complete(c.params)),
            failure=c.failure,
            reason=c.reason,
            deployment=c.deployment,
            warm_start_from=c.origin,
        )
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.COMPLETE,
                values=values,
                params=dict(c.params),
                distributions={n: distributions[n] for n in c.params},
                user_attrs=record.to_attrs(),
                system_attrs=dict(system_attrs),
            )
        )
    study.set_user_attr(
        WARM_START_STUDY_ATTR,
        {
            "study": plan.study,
            "storage": plan.storage,
            "top": plan.top,
            "enqueued": [e.origin for e in plan.enqueue],
            "carried": len(plan.carried),
        },
    )
    for line in plan.messages:
        say(line)


def describe_done(attrs: dict[str, Any]) -> str:
    """What the study attribute says about a warm start already done."""
    info = attrs.get(WARM_START_STUDY_ATTR)
    if not isinstance(info, dict):
        return ""
    return (
        f"warm-started from {info.get('study')!r} when it began "
        f"({len(info.get('enqueued') or [])} configurations enqueued, "
        f"{info.get('carried', 0)} failed launches carried)"
    )
