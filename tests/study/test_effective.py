from __future__ import annotations

from autotune.space.settings import ServiceSettings
from autotune.trial.effective import find_overrides


def test_switch_rewritten_by_server_is_flagged() -> None:
    tuned = {
        "decode": ServiceSettings(
            flags={"--mem-fraction-static": "0.85"}, remove_flags={"--disable-custom-all-reduce"}
        )
    }
    effective = {"decode": {"mem_fraction_static": 0.85, "disable_custom_all_reduce": True}}
    overrides = find_overrides(tuned, effective)
    assert len(overrides) == 1
    assert "--disable-custom-all-reduce" in overrides[0]
    assert "decode" in overrides[0]


def test_equal_values_in_other_spelling_are_not_overrides() -> None:
    tuned = {
        "decode": ServiceSettings(
            flags={"--speculative-num-steps": "3", "--disable-cuda-graph": None}
        )
    }
    effective = {"decode": {"speculative_num_steps": 3, "disable_cuda_graph": True}}
    assert find_overrides(tuned, effective) == []


def test_unreported_flags_are_not_judged() -> None:
    tuned = {"prefill": ServiceSettings(flags={"--chunked-prefill-size": "4096"})}
    assert find_overrides(tuned, {"prefill": {"other": 1}}) == []
    assert find_overrides(tuned, {}) == []


def test_removed_value_flag_is_left_to_server_default() -> None:
    tuned = {
        "decode": ServiceSettings(remove_flags={"--cuda-graph-max-bs", "--speculative-algorithm"})
    }
    effective = {"decode": {"cuda_graph_max_bs": 160, "speculative_algorithm": None}}
    assert find_overrides(tuned, effective) == []
