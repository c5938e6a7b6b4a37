"""This process as one worker of a study that several ``autotune run`` processes share.

What a worker keeps in the study (Optuna's own tables, so it travels with the study):

* its record, study system attribute ``autotune:worker:<name>``: host, pid, deployment,
  state, the trial and phase it is on, when it was last seen. ``autotune status`` reads it.
* the owner of each of its trials, trial system attribute ``autotune:worker``.
* a heartbeat per running trial (Optuna's ``trial_heartbeats`` table, the database's clock).

A background thread writes the record and the running trial's heartbeat every
``heartbeat_s`` and promptly after a phase change, so the tuning loop itself never waits on
these writes. A worker that dies stops beating: once a trial's heartbeat is older than
``lease_s`` any live worker fails it (``worker_lost``, with the reason) in one transaction
that only a RUNNING trial passes, so exactly one worker does it and re-queues the config.
The lease is measured on the database server's clock: workers' clocks do not matter.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import optuna
import sqlalchemy
from optuna.trial import TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotune.errors import AutotuneError
from autotune.failures import Failure
from autotune.study._optuna_compat import create_scoped_session as _create_scoped_session
from autotune.study._optuna_compat import rdb_models as _rdb_models
from autotune.study._optuna_compat import rdb_of as _rdb
from autotune.study._optuna_compat import (
    set_trial_attr_without_commit,
    storage_of,
    study_id_of,
    trial_id_of,
)
from autotune.study.storage import STORAGE_EXCEPTIONS, describe_storage_failure

WORKER_ATTR_PREFIX = "autotune:worker:"
"""Study system attribute ``autotune:worker:<name>``: that worker's :class:`WorkerRecord`."""
TRIAL_WORKER_ATTR = "autotune:worker"
"""Trial system attribute: the name of the worker that owns the trial (set at ask)."""
WORKER_LOST = Failure.worker_lost.value
"""Trial user attribute ``failure`` of a RUNNING trial failed because its worker died."""

WorkerState = Literal["running", "stopped", "interrupted", "failed"]
HEARTBEAT_S = 10.0
LEASE_S = 60.0


def worker_key(name: str) -> str:
    """The study system attribute that holds worker ``name``'s record."""
    return WORKER_ATTR_PREFIX + name


def parse_time(text: str) -> dt.datetime:
    """An ISO-8601 timestamp as an aware datetime (a naive one is taken as UTC)."""
    parsed = dt.datetime.fromisoformat(text.strip())
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.timezone.utc)


class WorkerRecord(BaseModel):
    """One worker of a study, as it last wrote itself (``autotune:worker:<name>``).

    Timestamps are ISO-8601 strings in UTC by the worker's clock (stored as JSON as they
    are); unknown keys are ignored so that a newer writer does not break an older reader.
    """

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    """``--worker NAME`` (default ``<hostname>/<deployment name>``)."""
    host: str
    pid: int
    deployment: str
    """The deployment's name."""
    started_at: str
    seen_at: str
    """Refreshed by the heartbeat thread every ``heartbeat_s``."""
    state: WorkerState
    """The last state the worker wrote."""
    trial: int | None = None
    """The trial it is on (``None`` between trials)."""
    phase: str | None = None
    """``ask``, ``restart``, ``probe``, ``warmup``, ``measure``, ``store``, ``re-measure``."""
    done: int = Field(default=0, ge=0)
    """Trials this worker completed (COMPLETE) in this process."""
    heartbeat_s: float = Field(gt=0)
    lease_s: float = Field(gt=0)
    """A "running" worker not seen for this long is lost."""

    @field_validator("started_at", "seen_at")
    @classmethod
    def _iso_time(cls, value: str) -> str:
        parse_time(value)  # ValueError -> ValidationError
        return value

    @field_validator("heartbeat_s", "lease_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value

    @property
    def seen(self) -> dt.datetime:
        return parse_time(self.seen_at)

    @property
    def started(self) -> dt.datetime:
        return parse_time(self.started_at)

    def seen_ago(self, now: dt.datetime) -> float:
        """Seconds since the worker last wrote its record (its clock vs the reader's)."""
        return (now - self.seen).total_seconds()

    def is_live(self, now: dt.datetime) -> bool:
        return self.state == "running" and self.seen_ago(now) <= self.lease_s

    def describe_gone(self, now: dt.datetime) -> str:
        """Why this worker is not live, for a trial's reason."""
        if self.state != "running":
            return f"it {self.state}"
        if is_gone(self):
            return f"pid {self.pid} on {self.host} is not running"
        return f"not seen for {self.seen_ago(now):.0f} s, lease {self.lease_s:g} s"


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def default_worker_name(deployment: str) -> str:
    return f"{socket.gethostname()}/{deployment}"


class UnreadableRecord(BaseModel):
    """A ``autotune:worker:*`` attribute that is not a :class:`WorkerRecord`."""

    model_config = ConfigDict(frozen=True)

    key: str
    error: str


def parse_worker_records(
    system_attrs: Mapping[str, Any],
) -> tuple[list[WorkerRecord], list[UnreadableRecord]]:
    """The worker records among a study's system attributes, and the ones that are not
    (invalid, or stored under another name's key)."""
    records: list[WorkerRecord] = []
    bad: list[UnreadableRecord] = []
    for key in sorted(system_attrs):
        if not key.startswith(WORKER_ATTR_PREFIX):
            continue
        raw = system_attrs[key]
        try:
            if isinstance(raw, str):  # a record stored JSON-encoded twice
                raw = json.loads(raw)
            if not isinstance(raw, Mapping):
                raise ValueError(f"not a JSON object but {type(raw).__name__}")
            rec = WorkerRecord.model_validate(raw)
            if worker_key(rec.name) != key:  # one record per name, stored under its name
                raise ValueError(f"the record is of worker {rec.name!r}, not of this key")
            records.append(rec)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in exc.errors()
            )
            bad.append(UnreadableRecord(key=key, error=problems[:300]))
        except ValueError as exc:  # json.JSONDecodeError included
            bad.append(UnreadableRecord(key=key, error=str(exc)[:300]))
    return records, bad


def read_workers(study: optuna.Study) -> dict[str, WorkerRecord | None]:
    """Every worker record of the study by name (None: a record that does not parse)."""
    records, bad = parse_worker_records(
        storage_of(study).get_study_system_attrs(study_id_of(study))
    )
    out: dict[str, WorkerRecord | None] = {b.key[len(WORKER_ATTR_PREFIX) :]: None for b in bad}
    out.update((r.name, r) for r in records)
    return out


class WorkerBusy(AutotuneError):
    """Another live process already works under this name (the runner reports it as a
    ConfigError on ``--worker``)."""


class Worker:
    """The record and heartbeats of this process; see the module docstring."""

    def __init__(
        self,
        study: optuna.Study,
        *,
        name: str,
        deployment: str,
        heartbeat_s: float = HEARTBEAT_S,
        lease_s: float = LEASE_S,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.study = study
        self.name = name
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self._on_error = on_error
        now = _utcnow().isoformat()
        self.record = WorkerRecord(
            name=name,
            host=socket.gethostname(),
            pid=os.getpid(),
            deployment=deployment,
            started_at=now,
            seen_at=now,
            state="running",
            heartbeat_s=heartbeat_s,
            lease_s=lease_s,
        )
        self._trial_id: int | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._started = False

    @property
    def key(self) -> str:
        return worker_key(self.name)

    def start(self, *, alone: bool = False) -> None:
        """Refuse a name a live process uses (with ``alone``: any other live worker); write
        the record; start beating."""
        records = read_workers(self.study)
        current = records.get(self.name)
        now = _utcnow()
        if alone:
            others = [
                r
                for n, r in records.items()
                if n != self.name and r is not None and r.is_live(now) and not is_gone(r)
            ]
            if others:
                raise WorkerBusy(
                    f"worker {others[0].name!r} (pid {others[0].pid} on {others[0].host}) is "
                    "already running on this study; several workers need a database server: "
                    "move the study with `autotune migrate --to postgresql://...`"
                )
        if (
            current is not None
            and current.is_live(now)
            and (current.host, current.pid) != (self.record.host, self.record.pid)
            and not is_gone(current)
        ):
            raise WorkerBusy(
                f"worker {self.name!r} is already running (pid {current.pid} on "
                f"{current.host}, seen {current.seen_ago(now):.0f} s ago); give this one "
                "another name with --worker"
            )
        self._write()
        self._started = True
        self._thread = threading.Thread(target=self._beat, name="autotune-heartbeat", daemon=True)
        self._thread.start()

    def on_trial(self, trial: optuna.Trial | None) -> None:
        """The trial this worker now runs (None: between trials); beats for it at once."""
        with self._lock:
            self._trial_id = None if trial is None else trial_id_of(trial)
            self.record.trial = None if trial is None else trial.number
            self.record.phase = None if trial is None else "ask"
        self._wake.set()  # the thread beats for it now (a trial that never beat is found
        # lost through its worker's record instead, see lost_trials)

    def on_phase(self, phase: str | None) -> None:
        """Shown by ``autotune status`` from the next beat (no write of its own: a trial
        has a dozen phases, and on SQLite every write takes the database lock)."""
        with self._lock:
            self.record.phase = phase

    def trial_done(self) -> None:
        with self._lock:
            self.record.done += 1

    def stop(self, state: WorkerState) -> None:
        """Last record (stopped, interrupted or failed); the thread ends."""
        if not self._started:
            return  # never registered (e.g. the name was taken): nothing of ours to update
        self._started = False
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self.record.state = state
            self.record.trial = None
            self.record.phase = None
            self._trial_id = None
        try:
            self._write()
        except STORAGE_EXCEPTIONS as exc:
            self._error(f"could not record worker {self.name!r} as {state}: {exc}")

    # ------------------------------------------------------------------ thread

    def _beat(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.heartbeat_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._write()
                trial_id = self._trial_id
                rdb = _rdb(storage_of(self.study))
                if trial_id is not None and rdb is not None:
                    rdb.record_heartbeat(trial_id)
                if self._failing:
                    self._failing = False
                    self._error(f"worker {self.name!r}: heartbeats are written again")
            except Exception as exc:  # the database is away: say so once, keep trying
                if not self._failing:
                    self._failing = True
                    self._error(
                        f"worker {self.name!r}: heartbeat not written "
                        f"({describe_storage_failure(exc)}); retrying"
                    )

    def _write(self) -> None:
        with self._lock:
            self.record.seen_at = _utcnow().isoformat()
            value: dict[str, Any] = self.record.model_dump()
        # Straight to the database (not through the tuner's retrying storage): a heartbeat
        # that fails is reported once and tried again at the next beat.
        storage = _rdb(storage_of(self.study)) or storage_of(self.study)
        storage.set_study_system_attr(study_id_of(self.study), self.key, value)

    def _error(self, text: str) -> None:
        if self._on_error is not None:
            self._on_error(text)


def is_gone(record: WorkerRecord) -> bool:
    """A record of this host whose process is gone (a kill -9 leaves a fresh-looking one)."""
    if record.host != socket.gethostname():
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass(frozen=True)
class LostTrial:
    trial_id: int
    number: int
    worker: str | None
    silent_s: float | None
    """Seconds since its last heartbeat (None: it never sent one)."""


def lost_trials(
    study: optuna.Study, *, lease_s: float, exclude_worker: str | None = None
) -> list[LostTrial]:
    """RUNNING trials whose worker stopped beating more than ``lease_s`` ago.

    A trial without any heartbeat counts when its worker's record is lost or missing and the
    trial is older than the lease (it died between ``ask`` and the first beat).
    ``exclude_worker``: this worker's own trials are its business (see the runner).
    """
    rdb = _rdb(storage_of(study))
    if rdb is None:
        return []
    trials = _rdb_models.TrialModel.__table__
    beats = _rdb_models.TrialHeartbeatModel.__table__
    attrs = _rdb_models.TrialSystemAttributeModel.__table__
    query = (
        sqlalchemy.select(
            trials.c.trial_id,
            trials.c.number,
            trials.c.datetime_start,
            beats.c.heartbeat,
            attrs.c.value_json,
        )
        .select_from(
            trials.outerjoin(beats, beats.c.trial_id == trials.c.trial_id).outerjoin(
                attrs,
                (attrs.c.trial_id == trials.c.trial_id) & (attrs.c.key == TRIAL_WORKER_ATTR),
            )
        )
        .where(trials.c.study_id == study_id_of(study), trials.c.state == TrialState.RUNNING)
    )
    with rdb.engine.connect() as conn:
        rows = conn.execute(query).all()
        if not rows:
            return []
        now = conn.execute(
            sqlalchemy.select(sqlalchemy.func.current_timestamp(type_=sqlalchemy.DateTime))
        ).scalar_one()
    # PostgreSQL answers with a time zone, the heartbeat column has none (both are the
    # session's local time): compare them naive, as Optuna does.
    now = now.replace(tzinfo=None)
    workers = read_workers(study)
    wall = _utcnow()
    lost = []
    for trial_id, number, started, beat, owner_json in rows:
        owner = _json_str(owner_json)
        if exclude_worker is not None and owner == exclude_worker:
            continue
        if beat is not None:
            silent = (now - beat).total_seconds()
            if silent > lease_s:
                lost.append(LostTrial(trial_id, number, owner, silent))
            continue
        record = workers.get(owner) if owner is not None else None
        if record is not None and record.is_live(wall):
            continue
        age = (dt.datetime.now() - started).total_seconds() if started is not None else None
        if age is None or age > lease_s:
            lost.append(LostTrial(trial_id, number, owner, None))
    return lost


def _json_str(raw: Any) -> str | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def fail_lost_trial(study: optuna.Study, lost: LostTrial, *, reason: str) -> bool:
    """Fail ``lost`` as ``worker_lost`` with ``reason`` if it is still RUNNING.

    One transaction with the trial row locked: attributes and state together, and only the
    first of several workers doing it at once succeeds (True).
    """
    rdb = _rdb(storage_of(study))
    if rdb is None:
        return False
    with _create_scoped_session(rdb.scoped_session, True) as session:
        row = _rdb_models.TrialModel.find_or_raise_by_id(lost.trial_id, session, for_update=True)
        if row.state != TrialState.RUNNING:
            return False
        model = _rdb_models.TrialUserAttributeModel
        for key, value in (("failure", WORKER_LOST), ("reason", reason)):
            set_trial_attr_without_commit(rdb, session, model, lost.trial_id, key, value)
        row.state = TrialState.FAIL
        row.datetime_complete = dt.datetime.now()
    return True
