"""``autotune status``: who works on a study and how far it got, read from the storage.

Several ``autotune run`` workers may share one study (PostgreSQL). Each records itself in
Optuna's own tables (issue 6 design):

* study system attribute ``autotune:worker:<name>``: a JSON dict (:class:`WorkerRecord`)
  the worker refreshes from a heartbeat thread (``seen_at``) and updates at each phase;
* trial system attribute ``autotune:worker``: the name of the worker that asked the trial.

This module is the read side (the record model and its parser live in workers.py): one read of
the trials and one of the study system attributes give every worker's liveness (a
"running" record whose ``seen_at`` is older than its lease is *lost*: the worker died
without saying so), the trials each worker completed (counted from the trials, not trusted
from the record), the running trials with their phase and age, the study's counts and the
best configuration so far. A malformed record never stops the command: it is listed as
unreadable with its key. Given what this shell would start, it also says whether the services
would inherit the variables the newest trial ran with (:mod:`autotune.study.environment`).

The output (JSON and rich tables, under the model's field names) is
:mod:`autotune.study.status_view`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Literal

import optuna
from optuna.trial import TrialState
from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import StorageError
from autotune.failures import Failure
from autotune.results import (
    THROUGHPUT,
    WARM_START_ATTR,
    best_estimate,
    carried,
    feasible,
    format_estimate,
    objective_label,
)
from autotune.study._optuna_compat import StudySnapshot, storage_of, study_id_of
from autotune.study.environment import EnvironmentCheck, check_environment
from autotune.study.workers import (
    TRIAL_WORKER_ATTR,
    WORKER_LOST,
    UnreadableRecord,
    WorkerRecord,
    WorkerState,
    parse_worker_records,
    worker_key,
)
from autotune.trial.record import ServiceRecord, TrialRecord

Liveness = Literal["running", "lost", "stopped", "interrupted", "failed"]
_LIVENESS_ORDER = {"running": 0, "lost": 1, "interrupted": 2, "failed": 3, "stopped": 4}


# --- the status model ------------------------------------------------------------------


class WorkerStatus(BaseModel):
    """One worker as ``autotune status`` shows it."""

    model_config = ConfigDict(frozen=True)

    name: str
    key: str
    host: str
    pid: int
    deployment: str
    liveness: Liveness
    """``running``; ``lost`` (state running but not seen within its lease); else its state."""
    state: WorkerState
    """The state the worker wrote (``running`` for a lost worker)."""
    trial: int | None
    """The trial it is on; only while ``liveness`` is ``running``."""
    phase: str | None
    """Its phase; only while ``liveness`` is ``running``."""
    done: int
    """COMPLETE trials owned by this worker (counted from the trials)."""
    done_reported: int
    """``done`` as the worker's record says (its current or last process only)."""
    lost_trials: int
    """This worker's trials failed with ``failure="worker_lost"``."""
    running_trials: int
    """RUNNING trials owned by this worker."""
    seen_ago_s: float
    """Seconds since ``seen_at`` (negative when the worker's clock is ahead)."""
    started_at: str
    seen_at: str
    heartbeat_s: float
    lease_s: float


class RunningTrial(BaseModel):
    model_config = ConfigDict(frozen=True)

    number: int
    worker: str | None
    """The owner (trial system attribute ``autotune:worker``); ``None`` when unrecorded."""
    worker_liveness: Liveness | None
    """The owner's liveness; ``None`` when it has no readable record."""
    phase: str | None
    """From the owner's record, when it says it is on this trial."""
    running_s: float | None
    """Seconds since the trial started."""


class BestSoFar(BaseModel):
    """The configuration ``autotune best`` would pick (:func:`autotune.results.best_estimate`)."""

    model_config = ConfigDict(frozen=True)

    trial: int
    mean: float
    half_width: float | None
    lower: float
    n: int
    text: str
    """:func:`autotune.results.format_estimate` of it."""


class BestRun(BaseModel):
    """The highest single measurement (feasible, fully measured, not reused)."""

    model_config = ConfigDict(frozen=True)

    trial: int
    throughput: float


class StudyStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    study: str
    as_of: datetime
    trials: int
    """The study's own trials (carried warm-start trials are not counted anywhere)."""
    carried: int = 0
    """Failed launches a warm start carried from earlier studies (evidence, not trials)."""
    carried_from: list[str] = Field(default_factory=list)
    """The studies they came from."""
    states: dict[str, int]
    """Trials by state: COMPLETE, RUNNING, WAITING, FAIL always; other states when present."""
    reused: int
    """COMPLETE trials that copied another trial's result (``reused_from``)."""
    infeasible: int
    """COMPLETE trials with a ``failure`` (crashed, forbidden, wrong output, ...)."""
    aborted: int
    """COMPLETE trials whose measurement was cut short (``aborted``)."""
    duplicate_configs: int
    """Distinct configurations measured by more than one (non-reused) COMPLETE trial:
    0 unless workers raced on a configuration."""
    duplicate_trials: list[list[int]] = Field(default_factory=list)
    """Trial numbers of each duplicated configuration."""
    unowned_trials: int
    """Trials without an ``autotune:worker`` owner (asked by a single-worker run)."""
    unregistered_owners: dict[str, int] = Field(default_factory=dict)
    """Owners named by trials that have no record, with their trial counts."""
    best: BestSoFar | None
    best_error: str | None = None
    """Why the best estimate could not be computed (malformed trial attributes)."""
    best_run: BestRun | None
    workers: list[WorkerStatus]
    unreadable: list[UnreadableRecord]
    running: list[RunningTrial]
    environment: EnvironmentCheck | None = None
    """The variables the services would inherit from this shell against the newest trial's
    (:mod:`autotune.study.environment`); ``None``: not asked (no study file at hand)."""


# --- reading ----------------------------------------------------------------------------


def study_status(
    study: optuna.Study,
    *,
    now: datetime | None = None,
    services: Mapping[str, ServiceRecord] | EnvironmentCheck | None = None,
) -> StudyStatus:
    """Everything ``autotune status`` shows, from one read of the trials and one of the
    study's system attributes (plus its user attributes, for the re-measurements).

    ``now`` (default: the current time) is what liveness and ages are measured against; a
    naive ``now`` is taken as UTC. ``services``: what this shell would start (their inherited
    variables are compared with the newest trial's), or a check already made (one that says
    why it could not be).
    """
    now = datetime.now(timezone.utc) if now is None else now
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    system_attrs = storage_of(study).get_study_system_attrs(study_id_of(study))
    every = study.get_trials(deepcopy=False)
    trials = [t for t in every if not carried(t)]  # carried warm-start trials are not its own
    records, unreadable = parse_worker_records(system_attrs)
    snapshot = StudySnapshot(study, every, system_attrs)
    metric_names = snapshot.metric_names or [THROUGHPUT]

    states: Counter[str] = Counter({s: 0 for s in ("COMPLETE", "RUNNING", "WAITING", "FAIL")})
    complete_by: Counter[str] = Counter()
    running_by: Counter[str] = Counter()
    lost_by: Counter[str] = Counter()
    owners: Counter[str] = Counter()
    unowned = reused = infeasible = aborted = 0
    configs: dict[str, list[int]] = {}
    best_run: BestRun | None = None
    for t in trials:
        states[t.state.name] += 1
        owner = t.system_attrs.get(TRIAL_WORKER_ATTR)
        owner = str(owner) if owner is not None else None
        if owner is None:
            unowned += 1
        else:
            owners[owner] += 1
        try:
            stored = TrialRecord.from_attrs(t.user_attrs, where=f"trial {t.number}")
        except StorageError:  # status shows what it can; `best` names the broken trial
            stored = TrialRecord(failure=Failure.unknown.value)
        if t.state == TrialState.RUNNING and owner is not None:
            running_by[owner] += 1
        elif t.state == TrialState.FAIL and owner is not None:
            lost_by[owner] += stored.failure == WORKER_LOST
        if t.state != TrialState.COMPLETE:
            continue
        if owner is not None:
            complete_by[owner] += 1
        is_reused = stored.reused_from is not None
        reused += is_reused
        failed = stored.failure is not None
        infeasible += failed
        aborted += bool(stored.aborted)
        if is_reused or failed or not stored.metrics or not t.values:
            continue  # not a measurement of its own
        if stored.config:
            key = json.dumps(stored.config, sort_keys=True, default=str)
            configs.setdefault(key, []).append(t.number)
        if feasible(t) and not stored.aborted:
            value = _throughput(t.values, metric_names)
            if value is not None and (best_run is None or value > best_run.throughput):
                best_run = BestRun(trial=t.number, throughput=value)

    duplicates = sorted(numbers for numbers in configs.values() if len(numbers) > 1)
    best, best_error = _best(snapshot)

    by_name = {r.name: r for r in records}
    workers = sorted(
        (
            _worker(r, now, complete_by[r.name], lost_by[r.name], running_by[r.name])
            for r in records
        ),
        key=lambda w: (_LIVENESS_ORDER[w.liveness], w.name),
    )
    liveness = {w.name: w for w in workers}
    local_now = now.astimezone().replace(tzinfo=None)  # Optuna's timestamps: naive local
    running = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        owner = t.system_attrs.get(TRIAL_WORKER_ATTR)
        owner = str(owner) if owner is not None else None
        w = liveness.get(owner) if owner is not None else None
        record = by_name.get(owner) if owner is not None else None
        phase = record.phase if record is not None and record.trial == t.number else None
        running.append(
            RunningTrial(
                number=t.number,
                worker=owner,
                worker_liveness=w.liveness if w is not None else None,
                phase=phase,
                running_s=_since(t.datetime_start, now, local_now),
            )
        )
    sources = sorted(
        {str(t.user_attrs[WARM_START_ATTR]).rsplit("#", 1)[0] for t in every if carried(t)}
    )
    return StudyStatus(
        study=study.study_name,
        as_of=now,
        trials=len(trials),
        carried=len(every) - len(trials),
        carried_from=sources,
        states=dict(states),
        reused=reused,
        infeasible=infeasible,
        aborted=aborted,
        duplicate_configs=len(duplicates),
        duplicate_trials=duplicates,
        unowned_trials=unowned,
        unregistered_owners={k: v for k, v in sorted(owners.items()) if k not in by_name},
        best=best,
        best_error=best_error,
        best_run=best_run,
        workers=workers,
        unreadable=unreadable,
        running=running,
        environment=(
            services
            if services is None or isinstance(services, EnvironmentCheck)
            else check_environment(study, services, trials=trials)
        ),
    )


def _worker(r: WorkerRecord, now: datetime, done: int, lost: int, running: int) -> WorkerStatus:
    ago = (now - r.seen).total_seconds()
    live: Liveness = r.state
    if r.state == "running" and ago > r.lease_s:
        live = "lost"
    on = live == "running"
    return WorkerStatus(
        name=r.name,
        key=worker_key(r.name),
        host=r.host,
        pid=r.pid,
        deployment=r.deployment,
        liveness=live,
        state=r.state,
        trial=r.trial if on else None,
        phase=r.phase if on else None,
        done=done,
        done_reported=r.done,
        lost_trials=lost,
        running_trials=running,
        seen_ago_s=ago,
        started_at=r.started_at,
        seen_at=r.seen_at,
        heartbeat_s=r.heartbeat_s,
        lease_s=r.lease_s,
    )


def _since(start: datetime | None, now: datetime, local_now: datetime) -> float | None:
    if start is None:
        return None
    if start.tzinfo is None:
        return (local_now - start).total_seconds()
    return (now - start).total_seconds()


def _throughput(values: Sequence[float], names: Sequence[str]) -> float | None:
    index = list(names).index(THROUGHPUT) if THROUGHPUT in names else 0
    if index >= len(values) or not math.isfinite(values[index]):
        return None
    return float(values[index])


def _best(study: optuna.Study) -> tuple[BestSoFar | None, str | None]:
    try:
        estimate = best_estimate(study)
    except StorageError as exc:  # a malformed trial: the rest of the status still shows
        return None, str(exc)[:300]
    if estimate is None:
        return None, None
    return (
        BestSoFar(
            trial=estimate.trial.number,
            mean=estimate.mean,
            half_width=estimate.half_width,
            lower=estimate.lower,
            n=estimate.n,
            text=format_estimate(estimate, objective_label(estimate.trial.metric_names)[1]),
        ),
        None,
    )
