"""Adaptive measurement: stop at the target CI, run to the cap when noisy, abort_if, 256 streams."""

from __future__ import annotations

import time

import pytest
from fake_openai_server import FakeServer
from pydantic import ValidationError

from autotune.loadgen import LiveEstimate, LoadSpec, run_load


def spec(**kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "concurrency": 4,
        "input_len": 8,
        "output_len": 8,
        "warmup_requests": 0,
        "request_timeout_s": 10,
        "max_duration_s": 10,
    }
    return LoadSpec.model_validate({**base, **kw})


def test_target_rel_ci_clears_default_requests_and_keeps_a_given_minimum() -> None:
    s = LoadSpec(target_rel_ci=0.05, min_duration_s=2, max_duration_s=30)
    assert s.requests is None and s.duration_s is None
    assert (s.target_rel_ci, s.min_duration_s) == (0.05, 2)
    assert LoadSpec(target_rel_ci=0.05, requests=32).requests == 32
    assert LoadSpec().target_rel_ci is None and LoadSpec().min_duration_s == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_rel_ci": 0.05, "duration_s": 5}, "exclude each other"),
        ({"target_rel_ci": 0}, "greater than 0"),
        ({"target_rel_ci": 1.5}, "less than 1"),
        ({"min_duration_s": -1}, "greater than or equal to 0"),
        ({"min_duration_s": 50, "max_duration_s": 20}, "min_duration_s .* exceeds"),
    ],
)
def test_invalid_adaptive_specs(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LoadSpec.model_validate(kwargs)


def test_adaptive_stop_on_a_steady_server(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.002
    result = run_load(
        fake_server.url,
        # 15%: a steady server's estimate gets there in ~0.5 s idle; on a machine 3x
        # oversubscribed the fake server's own timing is noisy and 10% took over 20 s.
        spec(target_rel_ci=0.15, min_duration_s=0.4, requests=20, max_duration_s=30),
    )
    assert result.stop_reason is not None and result.stop_reason.startswith("target CI reached")
    assert result.aborted is None
    est = result.estimate
    assert est is not None and est.rel_half_width is not None and est.rel_half_width <= 0.15
    assert 0.4 <= result.measure_seconds < 10  # ~0.5 s on an idle machine
    m = result.metrics
    assert m.completed >= 20 and m.failed == 0  # stopped dispatching; in-flight finished
    assert est.output_throughput == pytest.approx(m.output_throughput, rel=0.3)


def test_adaptive_runs_to_the_cap_on_a_noisy_server(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.003
    fake_server.behaviour.delay_spread = 1.5  # request speeds vary ~20x
    result = run_load(
        fake_server.url,
        spec(concurrency=2, target_rel_ci=0.005, max_duration_s=1.2, request_timeout_s=5),
    )
    assert result.stop_reason is not None and "max_duration_s reached" in result.stop_reason
    assert 1.1 <= result.measure_seconds < 3.0  # the 1.2 s cap, with room for a busy machine
    assert result.estimate is not None
    rel = result.estimate.rel_half_width
    assert rel is None or rel > 0.005


def test_abort_if_cuts_the_measure_phase(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.005
    seen: list[LiveEstimate] = []

    def rule(est: LiveEstimate) -> str | None:
        seen.append(est)
        return "below incumbent" if est.output_throughput > 0 else None

    t0 = time.perf_counter()
    result = run_load(fake_server.url, spec(requests=10_000, min_duration_s=0.3), abort_if=rule)
    # Uncut, the run would last max_duration_s (10 s); a cut one ends in well under 1 s idle
    # (2.1 s in a CI run on a busy machine), so 6 s still tells the two apart.
    assert time.perf_counter() - t0 < 6.0
    assert result.aborted == "below incumbent"
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("aborted: below incumbent")
    assert seen and all(e.elapsed_s >= 0.3 for e in seen)  # never before min_duration_s
    assert 0.3 <= result.measure_seconds < 2.5  # uncut: 10 s
    # In-flight requests are dropped: what is kept is what the last estimate saw, plus at
    # most one round of C=4 that finished between that tick and the cancellation (a busy
    # machine delays the cancel: 48 seen, 52 kept in a clean-clone run).
    assert seen[-1].completed > 0
    assert seen[-1].completed <= result.metrics.completed <= seen[-1].completed + 4
    assert all(r.ok for r in result.records)


def test_abort_if_returning_none_changes_nothing(fake_server: FakeServer) -> None:
    # 15 rounds of 8 chunks x 10 ms: >= 1.2 s, several estimate ticks (a 2 ms delay
    # finished 60 requests in 0.25 s, before the first tick, on a fast run).
    fake_server.behaviour.chunk_delay_s = 0.01
    calls: list[float] = []
    result = run_load(
        fake_server.url,
        spec(requests=60),
        abort_if=lambda e: calls.append(e.elapsed_s) or None,  # type: ignore[func-returns-value]
    )
    assert result.aborted is None and result.stop_reason is None
    assert result.metrics.completed == 60 and calls
    assert result.estimate is not None and result.estimate.completed == 60


def test_256_concurrent_streams(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.02
    result = run_load(
        fake_server.url, spec(concurrency=256, output_len=4, requests=512, warmup_requests=256)
    )
    m = result.metrics
    assert (m.completed, m.failed) == (512, 0)
    assert m.output_tokens == 512 * 4
    assert 192 <= fake_server.max_in_flight <= 256  # all (or nearly all) at once, never more
    assert len(fake_server.peers) <= 256
