"""Writing one trial's outcome into Optuna, the same way for every path.

Every finished trial carries the same constraint keys and the same user attributes (the
stored trial schema in docs/ARCHITECTURE.md), whether it was measured, refused before launch,
crashed, or reused from an identical earlier configuration.

This is also the study's secrets choke point: every attribute passes through
:func:`autotune.secrets.redact` before it reaches the storage, so a credential a deployment
hands its services (``HF_TOKEN`` in ``env``, ``--api-key X``) is stored as ``<redacted>``
and scrubbed from commands, log tails, reasons and the servers' reported arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StorageError
from autotune.failpoints import failpoint
from autotune.results import REMEASURE_PREFIX
from autotune.secrets import redact
from autotune.study._optuna_compat import CONSTRAINTS_KEY as _CONSTRAINTS_KEY
from autotune.study._optuna_compat import storage_of, trial_by_number, trial_id_of
from autotune.study.objectives import Objective
from autotune.study.storage import batched_writes
from autotune.trial.inherited_env import services_changes
from autotune.trial.record import SCHEMA_VERSION, TrialOutcome, TrialRecord, zero_phases


def reused_outcome(
    study: optuna.Study, previous: int, record: TrialRecord, *, objective: Objective
) -> TrialOutcome:
    """The outcome of trial ``previous`` (an identical configuration) copied to a new trial:
    nothing is launched; the copy says where it came from (``reused_from``)."""
    old = trial_by_number(study, previous)
    attrs = {k: v for k, v in old.user_attrs.items() if k not in ("is_baseline", "retry_of")}
    copied = TrialRecord.from_attrs(attrs, where=f"trial {previous}")
    copied.config = record.config
    copied.is_baseline = record.is_baseline
    copied.reused_from = previous
    copied.phase_seconds = zero_phases()
    copied.startup = {}  # it started nothing: the stages were the other trial's
    copied.schema_version = SCHEMA_VERSION
    constraints = {k: float(v) for k, v in old.constraints.items() if not k.isdigit()}
    return TrialOutcome(
        values=list(old.values or objective.failed_values()),
        constraints=constraints,
        record=copied,
    )


def inherited_changes(study: optuna.Study, number: int, record: TrialRecord) -> list[str]:
    """How the variables ``record``'s services inherit differ from those trial ``number``
    ran with (:mod:`autotune.trial.inherited_env`), compared as stored (secrets redacted);
    empty where either side did not record them. A configuration measured under other
    variables is not the same measurement: it is not reused, and not pooled in a race."""
    return trial_changes(trial_by_number(study, number), record)


def trial_changes(trial: FrozenTrial, record: TrialRecord) -> list[str]:
    """:func:`inherited_changes` against a trial already read."""
    try:
        stored = TrialRecord.from_attrs(trial.user_attrs, where=f"trial {trial.number}").services
    except StorageError:  # an unreadable record is not this check's to report
        return []
    then = {name: svc.inherited_env for name, svc in stored.items()}
    now = redact({name: svc.inherited_env for name, svc in record.services.items()})
    return services_changes(then, now)


def remeasured_changes(study: optuna.Study, number: int, record: TrialRecord) -> list[str]:
    """:func:`inherited_changes`, then against each stored re-measurement of trial ``number``
    that recorded its variables (the first that differs, its lines prefixed with the run): a
    trial stored before trial schema 8 recorded none, but its re-measurements since may have,
    and a race pools them all."""
    changed = inherited_changes(study, number, record)
    if changed:
        return changed
    now = redact({name: svc.inherited_env for name, svc in record.services.items()})
    prefix = f"{REMEASURE_PREFIX}{number}:"
    for key, raw in sorted(study.user_attrs.items()):
        if not key.startswith(prefix) or not isinstance(raw, Mapping):
            continue
        then = raw.get("inherited_env")
        if not isinstance(then, Mapping):
            continue
        lines = services_changes(
            {n: v for n, v in then.items() if v is None or isinstance(v, Mapping)}, now
        )
        if lines:
            return [f"re-measurement {key.removeprefix(prefix)}: {line}" for line in lines]
    return []


def finish_trial(
    study: optuna.Study, trial: optuna.Trial, outcome: TrialOutcome, *, constraint_keys: list[str]
) -> None:
    """Set attributes (secrets redacted) and constraints, then tell the values: COMPLETE in
    all cases.

    Attributes and constraints go to storage in one transaction where the storage allows it
    (:func:`autotune.study.storage.batched_writes`), then the state in a second one: a failed
    or interrupted write leaves the trial RUNNING with all of them or none.
    ``outcome.record`` is replaced by the redacted copy, so whatever the loop shows after
    this (the progress line's reason) is what was stored.
    """
    # Redact before truncating (to_attrs): a tail cut first could start inside a secret.
    outcome.record = redact_record(outcome.record)
    with batched_writes(study, trial_id_of(trial)):
        for key, value in outcome.record.to_attrs().items():
            trial.set_user_attr(key, value)
        if not _CONSTRAINTS_KEY:  # pragma: no cover - another Optuna layout
            for key in constraint_keys:
                trial.set_constraint(key, float(outcome.constraints.get(key, 0.0)))
        for key, value in constraint_attrs(outcome.constraints, constraint_keys).items():
            # What Trial.set_constraint stores, without its read-back of every attribute of
            # the trial (twice per trial: 10 ms on the development VM).
            storage_of(study).set_trial_system_attr(trial_id_of(trial), key, value)
    failpoint("storage.mid")
    study.tell(trial, outcome.values, state=TrialState.COMPLETE)


def constraint_attrs(
    constraints: Mapping[str, float], constraint_keys: Sequence[str]
) -> dict[str, Any]:
    """The trial system attributes that hold ``constraints`` (one per key, in
    ``constraint_keys`` order, missing ones 0.0): Optuna's per-key constraint attributes,
    and the list-valued ``constraints`` that optuna-dashboard reads. What
    :func:`finish_trial` writes; a trial built with ``optuna.trial.create_trial`` (a warm
    start's carried ones) takes them as its ``system_attrs``."""
    ordered = [float(constraints.get(key, 0.0)) for key in constraint_keys]
    attrs: dict[str, Any] = {}
    if _CONSTRAINTS_KEY:
        attrs = {
            f"{_CONSTRAINTS_KEY}:{k}": v for k, v in zip(constraint_keys, ordered, strict=True)
        }
    attrs["constraints"] = ordered  # the old list form, for optuna-dashboard
    return attrs


def fail_trial(
    study: optuna.Study,
    trial: optuna.Trial,
    *,
    failure: str,
    reason: str,
    secrets: Iterable[str] = (),
) -> None:
    """Mark a trial FAIL (interrupted, not a property of its configuration).

    ``reason`` is redacted; ``secrets`` are values known to be secret that the text alone
    may not reveal (e.g. the values of the trial's rendered services).
    """
    trial.set_user_attr("failure", failure)
    trial.set_user_attr("reason", redact(reason, extra=secrets))
    study.tell(trial, state=TrialState.FAIL)


def redact_record(record: TrialRecord) -> TrialRecord:
    """``record`` with every secret replaced (:func:`autotune.secrets.redact`)."""
    attrs = redact(record.model_dump(mode="json", exclude_unset=False))
    clean = TrialRecord.model_validate({**attrs, "extra": redact(record.extra)})
    clean.__pydantic_fields_set__ = set(record.model_fields_set)
    return clean
