"""CPU lists and the load generator's pinned thread (:mod:`autotune.cpus`)."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.cpus import available_cpus, format_cpu_list, parse_cpu_list, pinned


@pytest.mark.parametrize(
    ("text", "cpus", "written"),
    [("0", {0}, "0"), ("0,2", {0, 2}, "0,2"), ("4-7,12", {4, 5, 6, 7, 12}, "4-7,12"),
     (" 3 , 1-2 ", {1, 2, 3}, "1-3"), ("5-5", {5}, "5")],
)  # fmt: skip
def test_cpu_lists_as_taskset_writes_them(text: str, cpus: set[int], written: str) -> None:
    assert parse_cpu_list(text) == cpus
    assert format_cpu_list(cpus) == written


@pytest.mark.parametrize("bad", ["", "a", "1-", "3-1", "1,,2", "-1", "0x1", "1 2", "99999"])
def test_a_bad_cpu_list_names_the_item(bad: str) -> None:
    with pytest.raises(ValueError, match=r"CPU|range"):
        parse_cpu_list(bad)


@given(st.sets(st.integers(0, 300), min_size=1))
def test_format_then_parse_is_the_identity(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.skipif(len(available_cpus()) < 2, reason="needs two CPUs")
def test_pinned_moves_only_the_calling_thread_and_restores_it() -> None:
    mine = available_cpus()
    first = min(mine)
    seen: dict[str, frozenset[int]] = {}
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        inside.wait(10)
        seen["other"] = frozenset(os.sched_getaffinity(0))
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with pinned(frozenset({first})):
        seen["pinned"] = frozenset(os.sched_getaffinity(0))
        inside.set()
        done.wait(10)
    t.join()
    assert seen["pinned"] == {first}
    assert seen["other"] == mine  # another thread of the tuner keeps every core
    assert available_cpus() == mine
    with pinned(None):
        assert available_cpus() == mine
