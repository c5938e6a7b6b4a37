"""scripts/h200/side_by_side.py: every check study it fills has a hand-picked configuration
that its space accepts, and it queues baseline, hand-picked and winner in that order."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import optuna
import pytest

from autotune.space import load_space
from autotune.study.definition import load_study_definition

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "side_by_side", ROOT / "scripts" / "h200" / "side_by_side.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HAND_PICKED: dict[str, dict[str, object]] = _script().HAND_PICKED


@pytest.mark.parametrize("study", sorted(HAND_PICKED))
def test_the_hand_picked_configuration_is_one_of_the_space(study: str) -> None:
    path = ROOT / "studies" / f"{study}.yaml"
    definition = load_study_definition(path)
    assert definition.early_abort is None  # a check study measures everything it queues
    space = load_space(path.parent / definition.space)
    params = {**space.baseline_params(), **HAND_PICKED[study]}
    config = space.complete(params)
    assert not space.violations(config)
    changed = {k for k, v in params.items() if v != space.baseline_params().get(k)}
    assert changed == set(HAND_PICKED[study]) - {
        k for k, v in HAND_PICKED[study].items() if v == space.baseline_params().get(k)
    }
    assert changed, "the hand-picked configuration is the baseline"


def test_the_dense_check_study_is_queued_from_the_stored_h200_study(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'check.db'}"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "h200" / "side_by_side.py"),
         "--study", "vllm-h200-dense-check", "--winner-study", "vllm-h200-dense",
         "--winner-from", f"sqlite:///{ROOT / 'benchmarks' / 'h200' / 'vllm-h200-dense.db'}",
         "--storage", storage],
        capture_output=True, text=True, check=True,
    )
    assert "queued winner #13" in done.stdout, done.stdout
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    queued = optuna.load_study(study_name="vllm-h200-dense-check", storage=storage).trials
    assert [t.user_attrs.get("is_baseline", t.user_attrs.get("label")) for t in queued] == [
        True, "hand-picked", "winner #13"
    ]
    hand, winner = (t.system_attrs["fixed_params"] for t in queued[1:])  # waiting: not run yet
    assert hand["quantization"] == winner["quantization"] == "fp8"
    assert hand["kv_cache_dtype"] == "fp8" and hand["max_num_batched_tokens"] == 16384
    assert winner["enable_prefix_caching"] == "off"
