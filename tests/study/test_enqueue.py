"""A study's ``enqueue:``: configurations written as the baseline's changes, tried right after
the baseline of a new study, checked against the space before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from e2e_helpers import E2E_STUDY, REPO, load

from autotune.errors import ConfigError
from autotune.space import load_space
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner

VLLM_CPU = REPO / "search_spaces" / "vllm-cpu.yaml"


def _study(tmp_path: Path, enqueue: list[dict[str, object]]) -> Path:
    data = yaml.safe_load(E2E_STUDY.read_text())
    data["space"] = str(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    data["deployment"] = str(REPO / "launchers" / "sim-dsv4-flash-pd.yaml")
    data["enqueue"] = enqueue
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_variant_is_the_baseline_with_the_changes() -> None:
    space = load_space(VLLM_CPU)
    base = space.baseline_params()
    got = space.variant_params({"max_num_seqs": 16}, where="enqueue[0]")
    assert got == {**base, "max_num_seqs": 16}
    # enforce_eager switches compilation_mode off: the baseline's value for it is dropped
    eager = space.variant_params({"enforce_eager": True}, where="enqueue[1]")
    assert eager["enforce_eager"] is True and "compilation_mode" not in eager


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"max_num_seq": 16}, "enqueue[0].max_num_seq", "unknown parameter 'max_num_seq'"),
        ({"block_size": 16}, "enqueue[0].block_size", "16"),
        (
            {"enforce_eager": True, "compilation_mode": "NONE"},
            "enqueue[0].compilation_mode",
            "inactive",
        ),
    ],
)
def test_a_bad_variant_names_the_study_file_and_field(
    changes: dict[str, object], field: str, message: str
) -> None:
    space = load_space(VLLM_CPU)
    with pytest.raises(ConfigError) as info:
        space.variant_params(changes, where="enqueue[0]", file="studies/x.yaml")
    err = info.value
    assert (err.file, err.field) == ("studies/x.yaml", field)
    assert message in str(err)
    if "unknown" in message:
        assert "max_num_seqs" in (err.allowed or [])


def test_enqueued_configs_run_right_after_the_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _study(tmp_path, [{"speculative": "off"}, {"nccl_proto": "LL128"}])
    definition = load_study_definition(path)
    db = tmp_path / "s.db"
    tuner = Tuner(definition=definition, study_name="enq", storage_url=f"sqlite:///{db}", seed=1)
    space = tuner.space
    tuner.run(n_trials=3)
    trials = load("enq", db).get_trials()
    assert trials[0].user_attrs["is_baseline"] is True
    assert trials[0].params == space.baseline_params()
    off = space.variant_params({"speculative": "off"}, where="x")
    assert trials[1].params == off and "speculative_num_steps" not in off  # now inactive
    assert trials[2].params == {**space.baseline_params(), "nccl_proto": "LL128"}


def test_a_bad_enqueue_stops_before_a_study_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _study(tmp_path, [{"speculative": "off"}, {"nccl_protocol": "LL"}])
    definition = load_study_definition(path)
    with pytest.raises(ConfigError) as info:
        Tuner(definition=definition, study_name="bad", storage_url=f"sqlite:///{tmp_path}/b.db")
    assert info.value.file == str(path) and info.value.field == "enqueue[1].nccl_protocol"
    assert not (tmp_path / "b.db").exists()
