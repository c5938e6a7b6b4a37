"""Overrides of a flag that takes several values are judged as lists, not as text."""

from __future__ import annotations

from autotune.engines import load_manifest
from autotune.space.settings import ServiceSettings
from autotune.trial.effective import find_overrides


def test_list_flag_compared_as_a_list() -> None:
    tuned = {"decode": ServiceSettings(flags={"--cuda-graph-bs-decode": ("1", "2", "4")})}
    same = {"decode": {"cuda_graph_bs_decode": [1, 2, 4]}}
    other = {"decode": {"cuda_graph_bs_decode": [1, 2, 4, 8]}}
    assert find_overrides(tuned, same) == []
    [line] = find_overrides(tuned, other)
    assert "--cuda-graph-bs-decode" in line and "[1, 2, 4, 8]" in line


def test_alias_spelling_found_under_its_field() -> None:
    manifest = load_manifest("sglang", "0.5.23")
    tuned = {"decode": ServiceSettings(flags={"--tensor-parallel-size": "4"})}
    rewritten = {"decode": {"tp_size": 8}}
    assert find_overrides(tuned, rewritten) == []  # no field named tensor_parallel_size
    [line] = find_overrides(tuned, rewritten, manifest=manifest)
    assert "server runs 8" in line
