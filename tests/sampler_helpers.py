"""Shared by the sampler and surface tests: Optuna kept quiet, the benchmark harness loaded."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import optuna
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines and experimental warnings off for one test."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    optuna.logging.set_verbosity(verbosity)


def load_harness() -> ModuleType:
    """``benchmarks/sample_efficiency.py`` as a module (it is a script, not a package)."""
    name = "sample_efficiency"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
