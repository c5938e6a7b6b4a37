"""Checking a migrated study against its source, field by field (``compare_studies``).

``autotune migrate`` (autotune/study/migrate.py) proves every copy before keeping it: both
studies are read back through Optuna's API, whichever way the copy was made (rows as stored
or ``optuna.copy_study``), and compared field by field; the stored UTC trial times are
compared from the trials table where the storage has one. A copy that differs is reported
here in words and removed by the caller.

Why its own module: the comparison reads what the copy wrote without sharing any of its code,
so it stands apart from the copy; migrate.py stays the entry point and re-exports
``compare_studies``, ``TRIAL_FIELDS`` and ``MAX_LISTED``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.trial import TrialState

from autotune.errors import StorageError
from autotune.study.storage import STORAGE_EXCEPTIONS, describe_storage_failure, display_url

try:  # Optuna internals: the trials table, for the stored UTC times (checked, else skipped).
    from autotune.study._optuna_compat import rdb_models as _rdb_models

    _HAVE_MODELS = all(hasattr(_rdb_models, n) for n in ("StudyModel", "TrialModel"))
except ImportError:  # pragma: no cover - another Optuna layout: FrozenTrial times only
    _HAVE_MODELS = False

MAX_LISTED = 8
"""Differences (or running trials) named in an error message; the rest are counted."""

TRIAL_FIELDS = (
    "state",
    "values",
    "params",
    "distributions",
    "user_attrs",
    "system_attrs",
    "intermediate_values",
    "datetime_start",
    "datetime_complete",
    "constraints",
)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, BaseDistribution):
        return json.loads(distribution_to_json(value))
    return repr(value)


def _canon(value: Any) -> str:
    """Exact, NaN-safe comparison key: JSON with sorted keys (floats by repr)."""
    if isinstance(value, Mapping):
        value = {str(k): v for k, v in value.items()}
    return json.dumps(value, sort_keys=True, default=_json_default, allow_nan=True)


def _differing_keys(a: Any, b: Any) -> str:
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return ""
    keys = sorted(
        {str(k) for k in {*a, *b} if k not in a or k not in b or _canon(a[k]) != _canon(b[k])}
    )
    shown = ", ".join(keys[:MAX_LISTED]) + (", ..." if len(keys) > MAX_LISTED else "")
    return f" ({shown})" if keys else ""


def compare_studies(
    source: optuna.storages.BaseStorage,
    target: optuna.storages.BaseStorage,
    name: str,
) -> list[str]:
    """Every difference between study ``name`` in the two storages, in words (empty: equal).

    Study: directions, metric names, user and system attributes. Trials, matched by number:
    state, values, parameters and distributions, user and system attributes, intermediate
    values, start and completion datetimes, constraints.
    """
    a_study = optuna.load_study(study_name=name, storage=source)
    b_study = optuna.load_study(study_name=name, storage=target)
    a_id = source.get_study_id_from_name(name)
    b_id = target.get_study_id_from_name(name)
    out: list[str] = []
    study_fields: Sequence[tuple[str, Any, Any]] = (
        ("directions", a_study.directions, b_study.directions),
        ("metric names", a_study.metric_names, b_study.metric_names),
        (
            "study user attributes",
            source.get_study_user_attrs(a_id),
            target.get_study_user_attrs(b_id),
        ),
        (
            "study system attributes",
            source.get_study_system_attrs(a_id),
            target.get_study_system_attrs(b_id),
        ),
    )
    for label, a, b in study_fields:
        if _canon(a) != _canon(b):
            out.append(f"{label} differ{_differing_keys(a, b)}")
    a_trials = {t.number: t for t in source.get_all_trials(a_id, deepcopy=False)}
    b_trials = {t.number: t for t in target.get_all_trials(b_id, deepcopy=False)}
    missing = sorted(set(a_trials) - set(b_trials))
    extra = sorted(set(b_trials) - set(a_trials))
    if missing:
        out.append(f"trials missing from the copy: {_numbers(missing)}")
    if extra:
        out.append(f"trials only in the copy: {_numbers(extra)}")
    a_times, b_times = _stored_times(source, a_id), _stored_times(target, b_id)
    for number in sorted(set(a_trials) & set(b_trials)):
        for name_ in TRIAL_FIELDS:
            a = getattr(a_trials[number], name_)
            b = getattr(b_trials[number], name_)
            if _canon(a) != _canon(b):
                out.append(f"trial #{number}: {name_} differ{_differing_keys(a, b)}")
        if (
            a_times is not None
            and b_times is not None
            and a_times.get(number) != b_times.get(number)
        ):
            out.append(f"trial #{number}: stored (UTC) start/complete times differ")
    return out


def _stored_times(storage: optuna.storages.BaseStorage, study_id: int) -> dict[int, Any] | None:
    """Trial number -> the stored UTC (start, complete): FrozenTrial shows local time, where
    an hour repeated by a daylight-saving change reads the same for two stored values."""
    if not _HAVE_MODELS or not isinstance(storage, optuna.storages.RDBStorage):
        return None
    trials = _rdb_models.TrialModel.__table__
    query = sqlalchemy.select(
        trials.c.number, trials.c.datetime_start, trials.c.datetime_complete
    ).where(trials.c.study_id == study_id)
    with storage.engine.connect() as conn:
        return {number: (start, end) for number, start, end in conn.execute(query)}


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(f"#{n}" for n in numbers[:MAX_LISTED])
    return shown + (f" and {len(numbers) - MAX_LISTED} more" if len(numbers) > MAX_LISTED else "")


def _verify(
    source: optuna.storages.BaseStorage,
    target: optuna.storages.BaseStorage,
    name: str,
    source_url: str,
    target_url: str,
) -> None:
    """StorageError naming what differs when the copy is not the source study."""
    try:
        differences = compare_studies(source, target, name)
    except STORAGE_EXCEPTIONS as exc:
        raise StorageError(
            f"reading study {name!r} back from {display_url(source_url)} and "
            f"{display_url(target_url)} to check the copy failed (the copy is removed): "
            f"{describe_storage_failure(exc)}"
        ) from exc
    if not differences:
        return
    source_id = source.get_study_id_from_name(name)
    if source.get_all_trials(source_id, deepcopy=False, states=(TrialState.RUNNING,)):
        why = "the source changed while it was copied (a worker started?)"
    else:
        why = "the copy differs from the source"
    shown = "; ".join(differences[:MAX_LISTED])
    if len(differences) > MAX_LISTED:
        shown += f"; and {len(differences) - MAX_LISTED} more"
    raise StorageError(
        f"migration of study {name!r} from {display_url(source_url)} to "
        f"{display_url(target_url)} not verified: {why}: {shown}. The copy was removed from "
        "the target; the source is unchanged"
    )
