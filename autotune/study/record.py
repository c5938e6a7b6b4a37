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

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.failpoints import failpoint

try:  # Optuna's key for a trial's constraint values (Trial.set_constraint writes it too)
    from optuna.study._constrained_optimization import _CONSTRAINTS_KEY
except ImportError:  # pragma: no cover - another Optuna layout: Trial.set_constraint
    _CONSTRAINTS_KEY = ""
from autotune.secrets import redact
from autotune.study.objectives import Objective
from autotune.study.storage import batched_writes

LOG_TAIL_CHARS = 4000


@dataclass
class TrialOutcome:
    """Everything the loop learned about one trial."""

    values: list[float]
    constraints: dict[str, float]
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def failure(self) -> str | None:
        return self.attrs.get("failure")

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.constraints.values())


def _jsonable(value: Any) -> Any:
    """Optuna stores attributes as JSON; NaN/inf and non-JSON types are made safe."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return json.loads(json.dumps(value, default=str))


def failed_outcome(
    objective: Objective,
    attrs: dict[str, Any],
    *,
    failure: str,
    reason: str,
    log_tail: str = "",
) -> TrialOutcome:
    """An infeasible outcome (forbidden, crashed, wrong output, ...): ``attrs`` with the
    failure class, its reason and the log tail; the objective's failed values."""
    attrs.update(failure=failure, reason=reason, log_tail=log_tail)
    return TrialOutcome(
        values=objective.failed_values(),
        constraints=objective.failed_constraints(),
        attrs=attrs,
    )


def reused_outcome(
    study: optuna.Study, previous: int, attrs: dict[str, Any], *, objective: Objective
) -> TrialOutcome:
    """The outcome of trial ``previous`` (an identical configuration) copied to a new trial:
    nothing is launched; the copy says where it came from (``reused_from``)."""
    old = study.trials[previous]
    attrs = {
        **{k: v for k, v in old.user_attrs.items() if k not in ("is_baseline", "retry_of")},
        **{
            "config": attrs["config"],
            "is_baseline": attrs["is_baseline"],
            "reused_from": previous,
            "phase_seconds": {"restart": 0.0, "probe": 0.0, "warmup": 0.0, "measure": 0.0},
        },
    }
    constraints = {k: float(v) for k, v in old.constraints.items() if not k.isdigit()}
    return TrialOutcome(
        values=list(old.values or objective.failed_values()),
        constraints=constraints,
        attrs=attrs,
    )


def finish_trial(
    study: optuna.Study, trial: optuna.Trial, outcome: TrialOutcome, *, constraint_keys: list[str]
) -> None:
    """Set attributes (secrets redacted) and constraints, then tell the values: COMPLETE in
    all cases.

    Attributes and constraints go to storage in one transaction where the storage allows it
    (:func:`autotune.study.storage.batched_writes`), then the state in a second one: a failed
    or interrupted write leaves the trial RUNNING with all of them or none.
    ``outcome.attrs`` is replaced by the redacted copy, so whatever the loop shows after
    this (the progress line's reason) is what was stored.
    """
    # Redact before truncating: a tail cut first could start inside a secret and hide it.
    outcome.attrs = redact(outcome.attrs)
    ordered = [float(outcome.constraints.get(key, 0.0)) for key in constraint_keys]
    with batched_writes(study, trial._trial_id):
        for key, value in outcome.attrs.items():
            if key == "log_tail" and isinstance(value, str):
                value = value[-LOG_TAIL_CHARS:]
            trial.set_user_attr(key, _jsonable(value))
        for key, value in zip(constraint_keys, ordered, strict=True):
            if _CONSTRAINTS_KEY:
                # What Trial.set_constraint stores, without its read-back of every attribute
                # of the trial (twice per trial: 10 ms on the development VM).
                study._storage.set_trial_system_attr(
                    trial._trial_id, f"{_CONSTRAINTS_KEY}:{key}", value
                )
            else:
                trial.set_constraint(key, value)
        # optuna-dashboard reads constraints only from the old list-valued system attribute.
        study._storage.set_trial_system_attr(trial._trial_id, "constraints", ordered)
    failpoint("storage.mid")
    study.tell(trial, outcome.values, state=TrialState.COMPLETE)


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
