"""Optuna's internals, reached only through autotune/study/_optuna_compat.py, checked here:
the batching storage passes Optuna's own storage contract (``StorageTestCase``, shipped in
``optuna.testing``), and the installed Optuna is one this module was tested with."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import tomllib
from optuna.storages import BaseStorage, RDBStorage
from optuna.testing.pytest_storages import StorageTestCase
from packaging.specifiers import SpecifierSet

from autotune.study import _optuna_compat as compat
from autotune.study.storage import BatchingStorage, batched_writes, batching, open_storage

ROOT = Path(__file__).resolve().parents[2]


class TestBatchingStorageKeepsOptunasContract(StorageTestCase):
    """Every case of Optuna's storage test suite, on the wrapper the tuner writes through."""

    @pytest.fixture
    def storage(self, tmp_path: Path) -> Iterator[BaseStorage]:
        wrapped = batching(open_storage(f"sqlite:///{tmp_path / 'contract.db'}", create=True))
        assert isinstance(wrapped, BatchingStorage)
        yield wrapped
        wrapped._backend.engine.dispose()  # type: ignore[attr-defined]


def test_installed_optuna_is_within_the_tested_range() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [spec] = [d for d in deps if re.match(r"optuna\s*[<>=]", d)]
    allowed = SpecifierSet(spec.split("optuna", 1)[1].split(";")[0].strip())
    assert optuna.__version__ in allowed, (optuna.__version__, str(allowed))
    assert any(optuna.__version__.startswith(v + ".") for v in compat.OPTUNA_TESTED)
    assert not any(f"<{v}" in str(allowed) for v in compat.OPTUNA_TESTED)  # the cap is above


def test_a_batch_is_one_transaction_seen_whole_by_another_reader(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    study = optuna.create_study(storage=batching(open_storage(url, create=True)))
    trial = study.ask()
    other = RDBStorage(url)
    trial_id = compat.trial_id_of(trial)
    with batched_writes(study, trial_id):
        for i in range(5):
            trial.set_user_attr(f"k{i}", i)
        assert other.get_trial(trial_id).user_attrs == {}  # held until the block ends
    assert other.get_trial(trial_id).user_attrs == {f"k{i}": i for i in range(5)}


def test_the_accessors_reach_the_storage_under_the_wrappers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    study = optuna.create_study(storage=batching(open_storage(url, create=True)))
    trial = study.ask()
    assert isinstance(compat.storage_of(study), BatchingStorage)
    assert isinstance(compat.rdb_of(compat.storage_of(study)), RDBStorage)
    assert compat.rdb_of(optuna.storages.InMemoryStorage()) is None
    assert compat.trial_by_number(study, trial.number).number == trial.number
    assert compat.study_id_of(study) == study._study_id
    assert compat.CONSTRAINTS_KEY and compat.METRIC_NAMES_KEY  # found in this Optuna
    assert {"TrialModel", "StudySystemAttributeModel", "TrialHeartbeatModel"} <= set(
        dir(compat.rdb_models)
    )
