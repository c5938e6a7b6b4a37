"""Everything autotune needs from Optuna beyond its public API, in one module.

Claims, heartbeats, batched writes and the migration need what Optuna keeps private: the
storage under a study (``Study._storage``, ``_study_id``), a trial's id (``Trial._trial_id``),
the RDB storage's SQLAlchemy engine and table models (``optuna.storages._rdb.models``), its
cache wrapper (``_CachedStorage``), the constraint key, and the random state samplers draw
from (``LazyRandomState``, reseeded per trial by ``autotune/study/_trial_seed.py``). Each is
reached through a function here, so an Optuna release that moves one breaks this module and
its tests (tests/study/test_optuna_compat.py, tests/study/test_trial_seed.py), not the tuner
in the middle of a study; pyproject.toml caps Optuna at the minor releases this module was
tested with.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import optuna
from optuna.samplers._lazy_random_state import LazyRandomState  # what samplers draw from
from optuna.storages._rdb import models as rdb_models  # Optuna's table models
from optuna.storages._rdb.storage import _create_scoped_session as create_scoped_session
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from autotune.study.storage import Retry

_T = TypeVar("_T")

OPTUNA_TESTED = ("5.0",)
"""Optuna minor releases the test suite ran this module with (pyproject.toml caps Optuna
below the next one: ``optuna>=4.5,<5.1``)."""


try:  # the constraint values' key (what Trial.set_constraint writes)
    from optuna.study._constrained_optimization import _CONSTRAINTS_KEY as CONSTRAINTS_KEY
except ImportError:  # pragma: no cover - another Optuna layout: Trial.set_constraint
    CONSTRAINTS_KEY = ""

try:  # the system attribute that holds a study's metric names
    from optuna.study.study import _SYSTEM_ATTR_METRIC_NAMES as METRIC_NAMES_KEY
except ImportError:  # pragma: no cover - another Optuna layout: Study.metric_names only
    METRIC_NAMES_KEY = None  # type: ignore[assignment]

__all__ = [
    "StudySnapshot",
    "CONSTRAINTS_KEY",
    "LazyRandomState",
    "METRIC_NAMES_KEY",
    "OPTUNA_TESTED",
    "BatchingStorage",
    "batched_writes",
    "batching",
    "create_scoped_session",
    "rdb_models",
    "rdb_of",
    "seed_lazy_random_state",
    "set_trial_attr_without_commit",
    "storage_of",
    "study_id_of",
    "trial_by_number",
    "trial_id_of",
]


def set_trial_attr_without_commit(
    rdb: optuna.storages.RDBStorage, session: Any, model: Any, trial_id: int, key: str, value: Any
) -> None:
    """Optuna's own attribute upsert inside a session the caller commits."""
    rdb._set_trial_attr_without_commit(session, model, trial_id, key, value)


def seed_lazy_random_state(state: LazyRandomState, seed: int) -> None:
    """Seed the random state an Optuna sampler draws from (``LazyRandomState._rng``, built
    on first use), in place: whatever shares the object draws from the new stream."""
    state._rng = np.random.RandomState(seed)


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage a study reads and writes through (autotune's wrappers included)."""
    return study._storage


def study_id_of(study: optuna.Study) -> int:
    return study._study_id


def trial_id_of(trial: optuna.Trial | FrozenTrial) -> int:
    return trial._trial_id


def rdb_of(storage: optuna.storages.BaseStorage) -> optuna.storages.RDBStorage | None:
    """The RDB storage under Optuna's cache (and autotune's batching) wrapper, if any."""
    while not isinstance(storage, optuna.storages.RDBStorage):
        inner = getattr(storage, "_backend", None)
        if inner is None:
            return None
        storage = inner
    return storage


def trial_by_number(study: optuna.Study, number: int) -> FrozenTrial:
    """Trial ``number`` as stored now (not from this process's cache of the study)."""
    storage = storage_of(study)
    return storage.get_trial(
        storage.get_trial_id_from_study_id_trial_number(study_id_of(study), number)
    )


class StudySnapshot(optuna.Study):
    """``study`` answering from trials and attributes already read.

    :func:`autotune.results.best_estimate` reads the trials, the metric names and the user
    attributes through the study; this gives it the ones ``autotune status`` read
    (:func:`autotune.study.status.study_status`), so a status costs one read of the trials
    (10,000 of them on a remote database are what dominates). Anything else falls through
    to the real study.
    """

    def __init__(
        self,
        study: optuna.Study,
        trials: list[FrozenTrial],
        system_attrs: Mapping[str, Any],
    ) -> None:  # no super().__init__(): it would read the storage again
        self.__dict__.update(study.__dict__)
        self._status_trials = trials
        self._status_system_attrs = system_attrs
        self._status_user_attrs: dict[str, Any] | None = None

    def get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)

    def _get_trials(
        self,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
        use_cache: bool = False,
    ) -> list[FrozenTrial]:
        trials = self._status_trials
        if states is not None:
            trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else list(trials)

    @property
    def user_attrs(self) -> dict[str, Any]:
        if self._status_user_attrs is None:
            self._status_user_attrs = self._storage.get_study_user_attrs(self._study_id)
        return copy.deepcopy(self._status_user_attrs)

    @property
    def metric_names(self) -> list[str] | None:
        if METRIC_NAMES_KEY is None:  # pragma: no cover
            return super().metric_names
        names = self._status_system_attrs.get(METRIC_NAMES_KEY)
        return list(names) if names is not None else None


# --------------------------------------------------------------------- batched writes

try:  # Optuna internals: one transaction for many writes (checked, with a plain fallback).
    from optuna.storages._cached_storage import _CachedStorage
    from optuna.storages._rdb import models as _rdb_models
    from optuna.storages._rdb.storage import _create_scoped_session

    _CAN_BATCH = all(
        hasattr(optuna.storages.RDBStorage, name)
        for name in ("_set_trial_param_without_commit", "_set_trial_attr_without_commit")
    )
except ImportError:  # pragma: no cover - another Optuna layout: writes stay one by one
    _CAN_BATCH = False
    _CachedStorage = object  # type: ignore[assignment,misc]


class BatchingStorage(_CachedStorage):  # type: ignore[misc,valid-type]
    """Optuna's cached RDB storage, plus :meth:`batch`: a trial's writes in one transaction.

    Every ``set_trial_param`` / ``set_trial_user_attr`` / ``set_trial_system_attr`` is its
    own SQLite commit (an fsync each: 4-20 ms on the development VM), and a trial makes
    about 40 of them (16 parameters, 20 attributes, constraints). Inside ``batch(trial_id)``
    those writes are held in memory and committed together when the block ends, so a block
    is all or nothing. That is within Optuna's contract for this class (writes to a trial
    are guaranteed durable once its state changes) and stricter than it: the loop flushes
    the parameters before it launches anything and the attributes before it tells the
    state. Writes outside a block, and to other trials, go straight through.
    """

    def __init__(
        self,
        backend: optuna.storages.RDBStorage,
        *,
        retry: Retry | None = None,
    ) -> None:
        super().__init__(backend)
        self._batch: tuple[int, list[tuple[str, Any]]] | None = None
        self._retry = retry
        """Runs each storage call (e.g. :func:`retrying` while a database server is away)."""

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        return fn() if self._retry is None else self._retry(what, fn)

    # Reads and idempotent writes: retried as they are while the server is away.
    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._call(
            "reading a trial", lambda: super(BatchingStorage, self).get_trial(trial_id)
        )

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._call(
            "reading the trials",
            lambda: super(BatchingStorage, self).get_all_trials(study_id, deepcopy, states),
        )

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call(
            "reading the study",
            lambda: super(BatchingStorage, self).get_study_system_attrs(study_id),
        )

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call(
            "reading the study", lambda: super(BatchingStorage, self).get_study_user_attrs(study_id)
        )

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "writing the study",
            lambda: super(BatchingStorage, self).set_study_system_attr(study_id, key, value),
        )

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "writing the study",
            lambda: super(BatchingStorage, self).set_study_user_attr(study_id, key, value),
        )

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._call(
            "reading a trial",
            lambda: super(BatchingStorage, self).get_trial_id_from_study_id_trial_number(
                study_id, trial_number
            ),
        )

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        # Not idempotent: a trial created just before the connection dropped stays RUNNING
        # without heartbeat or owner, and is failed as lost once its lease is over.
        return self._call(
            "creating a trial",
            lambda: super(BatchingStorage, self).create_new_trial(study_id, template_trial),
        )

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        attempts = 0

        def once() -> bool:
            nonlocal attempts
            attempts += 1
            if attempts > 1:  # the first attempt may have been committed after all
                current = self._backend.get_trial(trial_id)
                if current.state == state:
                    return True
            return super(BatchingStorage, self).set_trial_state_values(trial_id, state, values)

        return self._call("writing a trial's state", once)

    @property
    def url(self) -> str:
        return str(self._backend.url)

    @contextmanager
    def batch(self, trial_id: int) -> Iterator[None]:
        """Hold the writes to ``trial_id`` in the block; commit them together at its end.

        When the block raises, the held writes are dropped (nothing of it reaches storage).
        """
        if self._batch is not None:
            yield  # already batching: the outer block commits
            return
        self._batch = (trial_id, [])
        try:
            yield
            pending = self._batch[1]
        finally:
            self._batch = None
        self._call("writing a trial", lambda: self._flush(trial_id, pending))

    def _held(self, trial_id: int) -> list[tuple[str, Any]] | None:
        batch = self._batch
        return batch[1] if batch is not None and batch[0] == trial_id else None

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: optuna.distributions.BaseDistribution,
    ) -> None:
        held = self._held(trial_id)
        if held is None:
            self._call(
                "writing a trial",
                lambda: super(BatchingStorage, self).set_trial_param(
                    trial_id, param_name, param_value_internal, distribution
                ),
            )
        else:
            held.append(("param", (param_name, param_value_internal, distribution)))

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        held = self._held(trial_id)
        if held is None:
            self._call(
                "writing a trial",
                lambda: super(BatchingStorage, self).set_trial_user_attr(trial_id, key, value),
            )
        else:
            held.append(("user", (key, value)))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        held = self._held(trial_id)
        if held is None:
            self._call(
                "writing a trial",
                lambda: super(BatchingStorage, self).set_trial_system_attr(trial_id, key, value),
            )
        else:
            held.append(("system", (key, value)))

    def _flush(self, trial_id: int, pending: list[tuple[str, Any]]) -> None:
        """All held writes in one transaction: one lookup of the trial, the parameters, and
        one multi-row upsert per attribute table (per key on engines without upserts)."""
        if not pending:
            return
        backend = self._backend
        attrs: dict[str, dict[str, Any]] = {"user": {}, "system": {}}
        params = []
        for kind, args in pending:
            if kind == "param":
                params.append(args)
            else:
                attrs[kind][args[0]] = args[1]  # the last write of a key wins, as in Optuna
        with self._lock:
            study_id, _ = self._trial_id_to_study_id_and_number[trial_id]
            known = self._studies[study_id].param_distribution
            with _create_scoped_session(backend.scoped_session) as session:
                trial = _rdb_models.TrialModel.find_or_raise_by_id(trial_id, session)
                backend.check_trial_is_updatable(trial_id, trial.state)  # type: ignore[arg-type]
                for name, value, distribution in params:
                    previous = known.get(name)
                    if previous is None:  # first time this study sees it: Optuna's own path
                        backend._set_trial_param_without_commit(
                            session, trial_id, name, value, distribution
                        )
                        continue
                    optuna.distributions.check_distribution_compatibility(previous, distribution)
                    session.add(
                        _rdb_models.TrialParamModel(
                            trial_id=trial_id,
                            param_name=name,
                            param_value=value,
                            distribution_json=optuna.distributions.distribution_to_json(
                                distribution
                            ),
                        )
                    )
                for kind, values in attrs.items():
                    if values:
                        model = (
                            _rdb_models.TrialUserAttributeModel
                            if kind == "user"
                            else _rdb_models.TrialSystemAttributeModel
                        )
                        self._upsert(session, model, trial_id, values)
            for name, _, distribution in params:
                known.setdefault(name, distribution)

    def _upsert(self, session: Any, model: Any, trial_id: int, values: dict[str, Any]) -> None:
        rows = [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in values.items()
        ]
        dialect = self._backend.engine.name
        if dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0):
            from sqlalchemy.dialects.sqlite import insert
        elif dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
        else:
            for key, value in values.items():
                self._backend._set_trial_attr_without_commit(session, model, trial_id, key, value)
            return
        stmt = insert(model).values(rows)
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=[model.trial_id, model.key],
                set_={"value_json": stmt.excluded.value_json},
            )
        )


def batching(
    storage: optuna.storages.BaseStorage, *, retry: Retry | None = None
) -> optuna.storages.BaseStorage:
    """``storage`` with :meth:`BatchingStorage.batch` when it is an RDB storage."""
    if _CAN_BATCH and isinstance(storage, optuna.storages.RDBStorage):
        return BatchingStorage(storage, retry=retry)
    return storage


@contextmanager
def batched_writes(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Writes to ``trial_id`` in the block go to storage in one transaction when the study's
    storage can batch them (:class:`BatchingStorage`), else one by one as usual."""
    storage = storage_of(study)
    if isinstance(storage, BatchingStorage):
        with storage.batch(trial_id):
            yield
    else:
        yield
