"""The trial deadline of run_load: raise during warm-up, stop and keep data during measure."""

from __future__ import annotations

import time

import pytest
from fault_fixtures import StartServer, Timer

from autotune.errors import BenchError
from autotune.loadgen import LoadSpec, run_load

LONG_TIMEOUT_S = 30.0
"""Per-request timeout far beyond the deadline: only the deadline can end these calls, so an
upper bound a few seconds past the deadline tells the two apart with room for a busy CI
machine (its workers have starved a 0.2 s connect before)."""
SLACK_S = 2.5


def spec(**kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "concurrency": 2,
        "input_len": 8,
        "output_len": 4,
        "requests": 100,
        "warmup_requests": 2,
        "request_timeout_s": LONG_TIMEOUT_S,
        "max_duration_s": 60.0,
    }
    return LoadSpec.model_validate({**base, **kw})


def test_deadline_during_warmup_raises(start_server: StartServer) -> None:
    bad = start_server("hang", after=1)
    phases: list[str] = []
    with Timer() as t, pytest.raises(BenchError) as info:
        run_load(bad.url, spec(), on_phase=phases.append, deadline=time.monotonic() + 0.5)
    assert 0.45 < t.seconds < 0.5 + SLACK_S
    assert str(info.value).startswith("trial deadline reached during warm-up (1 of 2 warm-up")
    assert phases == ["warmup"]


def test_deadline_during_measure_keeps_what_was_measured(start_server: StartServer) -> None:
    bad = start_server("hang", after=2 + 5)  # warm-up, 5 measured, then every request hangs
    with Timer() as t:
        result = run_load(bad.url, spec(), deadline=time.monotonic() + 1.5)
    assert 1.45 < t.seconds < 1.5 + SLACK_S
    assert result.stop_reason == "trial deadline reached; in-flight requests cancelled"
    assert result.metrics.completed == 5 and result.metrics.failed == 0  # hung ones dropped
    assert result.measure_seconds < 1.6


def test_deadline_with_nothing_measured_raises(start_server: StartServer) -> None:
    bad = start_server("hang", after=2)
    with pytest.raises(BenchError, match="no request to .* completed before the trial deadline"):
        run_load(bad.url, spec(), deadline=time.monotonic() + 0.5)


def test_deadline_while_resolving_the_model(start_server: StartServer) -> None:
    bad = start_server("hang_all")
    with Timer() as t, pytest.raises(BenchError, match="trial deadline reached while asking"):
        run_load(bad.url, spec(), deadline=time.monotonic() + 0.4)
    assert t.seconds < 0.4 + SLACK_S


def test_deadline_already_passed(start_server: StartServer) -> None:
    good = start_server("ok")
    with pytest.raises(BenchError, match="trial deadline reached before the load"):
        run_load(good.url, spec(), deadline=time.monotonic() - 1)


def test_deadline_later_than_the_run_changes_nothing(start_server: StartServer) -> None:
    good = start_server("ok")
    result = run_load(good.url, spec(requests=6), deadline=time.monotonic() + 60)
    assert result.metrics.completed == 6 and result.stop_reason is None


def test_warmup_is_capped_by_max_duration_without_a_deadline(start_server: StartServer) -> None:
    bad = start_server("hang", after=0)
    with Timer() as t, pytest.raises(BenchError, match="warm-up did not finish within max_dur"):
        run_load(bad.url, spec(max_duration_s=0.5))
    assert t.seconds < 0.5 + SLACK_S
