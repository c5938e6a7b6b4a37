"""The closed-loop client against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import pytest
from fake_openai_server import MODEL, FakeServer

from autotune.errors import BenchError, ConfigError
from autotune.loadgen import SLO, LoadSpec, arun_load, run_load


def spec(**kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "concurrency": 4,
        "input_len": 16,
        "output_len": 8,
        "warmup_requests": 0,
        "requests": 8,
        "request_timeout_s": 10,
    }
    base.update(kw)
    return LoadSpec.model_validate(base)


def test_counts_tokens_from_usage_and_matches_server(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.002
    result = run_load(fake_server.url, spec(requests=12, output_len=8))
    m = result.metrics
    assert (m.completed, m.failed) == (12, 0)
    assert m.output_tokens == 12 * 8 == fake_server.tokens_sent
    assert m.input_tokens == 12 * 16
    assert m.usage_missing == 0
    assert result.model == MODEL
    assert fake_server.model_requests == 1
    assert all(p["model"] == MODEL for p in fake_server.payloads)
    assert all(
        len(p["prompt"]) == 16 and all(isinstance(t, int) for t in p["prompt"])
        for p in fake_server.payloads
    )
    p0 = fake_server.payloads[0]
    assert p0["stream"] is True and p0["stream_options"] == {"include_usage": True}
    assert p0["ignore_eos"] is True and p0["temperature"] == 0 and p0["max_tokens"] == 8
    assert [r.index for r in result.records] == list(range(12))
    r0 = result.records[0]
    assert r0.text == "".join(f" t{i}" for i in range(8))
    assert len(r0.chunk_times) == 8
    assert r0.send_time < r0.chunk_times[0] <= r0.chunk_times[-1] <= r0.end_time
    assert m.output_throughput == pytest.approx(96 / m.duration_s)
    assert m.duration_s == pytest.approx(
        max(r.end_time for r in result.records) - min(r.send_time for r in result.records)
    )


def test_closed_loop_never_exceeds_concurrency(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.001
    fake_server.behaviour.ttft_s = 0.005
    run_load(fake_server.url, spec(concurrency=3, requests=30, warmup_requests=3))
    assert fake_server.requests == 33
    assert fake_server.max_in_flight == 3  # reached, never exceeded


def test_keep_alive_reuses_at_most_c_connections(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.001
    run_load(fake_server.url, spec(concurrency=4, requests=40, warmup_requests=4))
    assert fake_server.requests == 44
    assert 1 <= len(fake_server.peers) <= 4


def test_warmup_excluded_and_phases_reported(fake_server: FakeServer) -> None:
    phases: list[str] = []
    progress: list[tuple[int, int]] = []
    result = run_load(
        fake_server.url,
        spec(warmup_requests=5, requests=7),
        on_phase=phases.append,
        on_progress=lambda d, t: progress.append((d, t)),
    )
    assert fake_server.requests == 12
    assert len(result.records) == 7 and result.metrics.completed == 7
    assert phases == ["warmup", "measure"]
    assert progress[-1] == (7, 7) and len(progress) == 7
    assert result.warmup_seconds > 0 and result.measure_seconds > 0
    # Warm-up prompts come first in the seeded sequence: measured ones are new prompts.
    measured = {tuple(p["prompt"]) for p in fake_server.payloads[5:]}
    assert not measured & {tuple(p["prompt"]) for p in fake_server.payloads[:5]}


def test_prompts_are_deterministic_in_seed(fake_server: FakeServer) -> None:
    run_load(fake_server.url, spec(requests=2, concurrency=1, seed=7))
    first = [p["prompt"] for p in fake_server.payloads]
    fake_server.reset_counters()
    run_load(fake_server.url, spec(requests=2, concurrency=1, seed=7))
    assert [p["prompt"] for p in fake_server.payloads] == first
    fake_server.reset_counters()
    run_load(fake_server.url, spec(requests=2, concurrency=1, seed=8))
    assert [p["prompt"] for p in fake_server.payloads] != first


def test_multi_token_chunks_use_usage_for_tpot(fake_server: FakeServer) -> None:
    fake_server.behaviour.tokens_per_chunk = 4
    fake_server.behaviour.chunk_delay_s = 0.02
    result = run_load(fake_server.url, spec(output_len=16, requests=4))
    for r in result.records:
        assert len(r.chunk_times) == 4
        assert r.output_tokens == 16
        # 3 gaps of 20 ms spread over 15 tokens after the first
        assert r.tpot_s == pytest.approx((r.end_time - r.chunk_times[0]) / 15)
    m = result.metrics
    assert m.output_tokens == 64
    assert m.itl_ms.p50 is not None and 15 <= m.itl_ms.p50 <= 60  # per chunk, not per token
    assert m.tpot_ms.p50 is not None and 3 <= m.tpot_ms.p50 <= 15


def test_latencies_reflect_server_delays(fake_server: FakeServer) -> None:
    fake_server.behaviour.ttft_s = 0.05
    fake_server.behaviour.chunk_delay_s = 0.01
    result = run_load(fake_server.url, spec(output_len=5, requests=4, concurrency=2))
    m = result.metrics
    assert m.ttft_ms.p50 is not None and 50 <= m.ttft_ms.p50 < 150
    assert m.tpot_ms.mean is not None and 10 <= m.tpot_ms.mean < 40
    assert m.e2e_ms.p50 is not None and 90 <= m.e2e_ms.p50 < 250


def test_usage_missing_falls_back_to_chunks_and_is_flagged(fake_server: FakeServer) -> None:
    fake_server.behaviour.mode = "no_usage"
    result = run_load(fake_server.url, spec(output_len=6, requests=5))
    m = result.metrics
    assert m.completed == 5 and m.usage_missing == 5
    assert m.output_tokens == 30
    assert all(r.completion_tokens is None for r in result.records)


@pytest.mark.parametrize(
    ("fail_mode", "message"),
    [
        ("error_event", "server error: boom"),
        ("http_error", "HTTP 503"),
        ("malformed", "malformed event"),
        ("drop", "RemoteProtocolError"),
        ("no_done", "stream ended before"),
    ],
)
def test_failures_are_counted_not_raised(
    fake_server: FakeServer, fail_mode: str, message: str
) -> None:
    fake_server.behaviour.fail_every = 3
    fake_server.behaviour.fail_mode = fail_mode
    result = run_load(fake_server.url, spec(requests=12, concurrency=1))
    m = result.metrics
    assert (m.completed, m.failed) == (8, 4)
    assert m.error_rate == pytest.approx(4 / 12)
    assert m.output_tokens == 8 * 8
    failed = [r for r in result.records if not r.ok]
    assert [r.index for r in failed] == [2, 5, 8, 11]
    assert all(message in (r.error or "") for r in failed), failed[0].error
    assert sum(m.errors.values()) == 4


def test_http_error_records_status(fake_server: FakeServer) -> None:
    fake_server.behaviour.fail_every = 2
    fake_server.behaviour.fail_mode = "http_error"
    result = run_load(fake_server.url, spec(requests=4, concurrency=1))
    assert [r.status for r in result.records] == [200, 503, 200, 503]


def test_warmup_error_aborts(fake_server: FakeServer) -> None:
    fake_server.behaviour.fail_every = 2
    with pytest.raises(BenchError, match="warm-up request .* failed: server error: boom"):
        run_load(fake_server.url, spec(warmup_requests=4, requests=4, concurrency=2))


def test_every_request_failing_raises_with_first_error(fake_server: FakeServer) -> None:
    fake_server.behaviour.mode = "http_error"
    match = r"all 6 measured requests .* failed; first error: HTTP 503"
    with pytest.raises(BenchError, match=match):
        run_load(fake_server.url, spec(requests=6))


def test_unreachable_server_names_url(dead_url: str) -> None:
    with pytest.raises(BenchError, match=f"unreachable.*{dead_url}"):
        run_load(dead_url, spec())
    with pytest.raises(BenchError, match=f"cannot connect to {dead_url}"):
        run_load(dead_url, spec(model="m", warmup_requests=0))


def test_models_endpoint_failure_is_clear(fake_server: FakeServer) -> None:
    fake_server.behaviour.models_status = 404
    with pytest.raises(BenchError, match="/v1/models answered HTTP 404"):
        run_load(fake_server.url, spec())
    result = run_load(fake_server.url + "/v1/", spec(model="explicit", requests=2))
    assert result.model == "explicit" and fake_server.payloads[0]["model"] == "explicit"


def test_bad_url_is_config_error() -> None:
    with pytest.raises(ConfigError, match="not an http"):
        run_load("localhost:8000", spec())


def test_request_timeout_enforced(fake_server: FakeServer) -> None:
    fake_server.behaviour.fail_every = 2
    fake_server.behaviour.fail_mode = "hang"
    t0 = time.perf_counter()
    # 1 s, not less: the answered half must finish inside it on a busy CI machine too.
    result = run_load(fake_server.url, spec(requests=4, concurrency=4, request_timeout_s=1.0))
    elapsed = time.perf_counter() - t0
    m = result.metrics
    assert (m.completed, m.failed) == (2, 2)
    timed_out = [r for r in result.records if not r.ok]
    assert all("timed out after 1 s" in (r.error or "") for r in timed_out)
    assert all(0.95 <= r.latency_s < 3.0 for r in timed_out)
    assert elapsed < 6


def test_duration_mode(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.01
    result = run_load(
        fake_server.url, spec(requests=None, duration_s=0.6, output_len=5, concurrency=2)
    )
    t0 = min(r.send_time for r in result.records)
    assert all(r.send_time < t0 + 0.6 + 0.02 for r in result.records)
    assert all(r.ok for r in result.records)
    # ~40 ms per request, 2 workers, 0.6 s: about 30 requests, all completed (drained)
    assert 10 <= result.metrics.completed <= 40
    assert 0.6 <= result.measure_seconds < 2.5  # 0.6 s and the drain; room for a busy machine
    assert result.stop_reason is None


def test_max_duration_cancels_in_flight(fake_server: FakeServer) -> None:
    fake_server.behaviour.chunk_delay_s = 0.05
    t0 = time.perf_counter()
    result = run_load(
        fake_server.url, spec(requests=1000, output_len=4, concurrency=3, max_duration_s=0.5)
    )
    assert time.perf_counter() - t0 < 4.0  # uncancelled: about a minute
    assert result.stop_reason is not None and "max_duration_s" in result.stop_reason
    assert 3 <= len(result.records) < 30
    assert all(r.ok for r in result.records)  # cancelled ones are not recorded
    assert result.measure_seconds < 2.0


def test_max_duration_with_nothing_completed_raises(fake_server: FakeServer) -> None:
    fake_server.behaviour.mode = "hang"
    with pytest.raises(BenchError, match="no request .* completed within max_duration_s=0.3"):
        run_load(fake_server.url, spec(requests=4, max_duration_s=0.3))


def test_goodput_counts_requests_meeting_every_slo(fake_server: FakeServer) -> None:
    fake_server.behaviour.slow_every = 2
    fake_server.behaviour.slow_extra_ttft_s = 0.15
    slo = SLO(ttft_ms=100)
    result = run_load(fake_server.url, spec(requests=8, concurrency=2, slo=slo))
    m = result.metrics
    assert m.slo_met == 4
    assert m.goodput == pytest.approx(4 / m.duration_s)
    assert m.request_throughput == pytest.approx(8 / m.duration_s)


def test_chat_api_skips_role_only_chunk(fake_server: FakeServer) -> None:
    result = run_load(fake_server.url, spec(api="chat", output_len=5, requests=3, input_len=12))
    p = fake_server.payloads[0]
    assert "prompt" not in p and len(p["messages"][0]["content"].split()) == 12
    assert all(len(r.chunk_times) == 5 for r in result.records)
    assert result.records[0].text == " t0 t1 t2 t3 t4"
    assert result.metrics.input_tokens == 36


@pytest.mark.parametrize(("crlf", "coalesce"), [(True, False), (False, True), (True, True)])
def test_framing_variants(fake_server: FakeServer, crlf: bool, coalesce: bool) -> None:
    fake_server.behaviour.crlf = crlf
    fake_server.behaviour.coalesce = coalesce
    fake_server.behaviour.tokens_per_chunk = 2
    result = run_load(fake_server.url, spec(output_len=7, requests=4))
    assert result.metrics.output_tokens == 28
    assert all(len(r.chunk_times) == 4 and r.text.count(" t") == 7 for r in result.records)


def test_async_variant_inside_running_loop(fake_server: FakeServer) -> None:
    async def main() -> int:
        result = await arun_load(fake_server.url, spec(requests=3))
        return result.metrics.completed

    assert asyncio.run(main()) == 3


def test_failure_streak_stops_duration_mode(fake_server: FakeServer) -> None:
    fake_server.behaviour.fail_every = 1  # every request fails fast
    fake_server.behaviour.fail_mode = "http_error"
    t0 = time.perf_counter()
    with pytest.raises(BenchError, match="all .* failed"):
        run_load(
            fake_server.url, spec(requests=None, duration_s=20, max_duration_s=30, concurrency=2)
        )
    assert time.perf_counter() - t0 < 10
    assert fake_server.requests <= 64 + 2


def test_streams_without_done_are_complete_when_the_server_never_sends_it(
    fake_server: FakeServer,
) -> None:
    """transformers serve ends a stream after the finish_reason/usage chunk, no [DONE]."""
    fake_server.behaviour.mode = "no_done"
    with pytest.raises(BenchError, match=r"\[DONE\]"):  # the default insists on [DONE]
        run_load(fake_server.url, spec(requests=6, concurrency=2))
    lenient = run_load(fake_server.url, spec(requests=6, concurrency=2, require_done=False))
    m = lenient.metrics
    assert (m.completed, m.failed) == (6, 0)
    assert m.output_tokens == 6 * 8


def test_no_done_is_still_a_failure_when_the_stream_was_cut_before_finishing(
    fake_server: FakeServer,
) -> None:
    fake_server.behaviour.fail_every = 2
    fake_server.behaviour.fail_mode = "drop"  # the body ends mid-generation: no finish_reason
    result = run_load(fake_server.url, spec(requests=4, concurrency=1, require_done=False))
    assert (result.metrics.completed, result.metrics.failed) == (2, 2)


def test_ignore_eos_is_left_out_when_none(fake_server: FakeServer) -> None:
    run_load(fake_server.url, spec(requests=2, concurrency=1, ignore_eos=None))
    assert fake_server.payloads and all("ignore_eos" not in p for p in fake_server.payloads)
    fake_server.payloads.clear()
    run_load(fake_server.url, spec(requests=2, concurrency=1))
    assert all(p["ignore_eos"] is True for p in fake_server.payloads)
