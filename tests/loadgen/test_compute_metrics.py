"""compute_metrics against hand-computed values (DOMAIN.md §3 definitions)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.loadgen import SLO, RequestRecord, compute_metrics, slo_margins


def rec(
    index: int,
    send: float,
    chunks: list[float],
    end: float,
    *,
    out: int | None,
    prompt: int | None = 10,
    error: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        send_time=send,
        end_time=end,
        chunk_times=chunks,
        prompt_tokens=prompt,
        completion_tokens=out,
        error=error,
    )


# r0: TTFT 100, E2E 350, TPOT (350-100)/2 = 125, ITL 100, 100
# r1: TTFT 200, E2E 450, TPOT (450-200)/4 = 62.5, ITL 200 (one chunk carried 4 tokens)
# r2: failed (ignored everywhere but the error rate)
# r3: TTFT 200, E2E 200, one token: no TPOT, no ITL
# r4: TTFT 300, E2E 400, TPOT (400-300)/1 = 100, ITL 50; no usage -> 2 chunks counted
RECORDS = [
    rec(0, 0.0, [0.1, 0.2, 0.3], 0.35, out=3),
    rec(1, 0.05, [0.25, 0.45], 0.5, out=5),
    rec(2, 0.1, [0.2], 0.3, out=None, error="boom"),
    rec(3, 0.4, [0.6], 0.6, out=1),
    rec(4, 0.5, [0.8, 0.85], 0.9, out=None, prompt=None),
]


def test_hand_computed_metrics() -> None:
    m = compute_metrics(RECORDS)
    assert m.duration_s == pytest.approx(0.9)  # first dispatch 0.0 -> last completion 0.9
    assert (m.completed, m.failed) == (4, 1)
    assert m.error_rate == pytest.approx(0.2)
    assert m.output_tokens == 11 and m.input_tokens == 30
    assert m.output_throughput == pytest.approx(11 / 0.9)
    assert m.total_throughput == pytest.approx(41 / 0.9)
    assert m.request_throughput == pytest.approx(4 / 0.9)
    assert m.usage_missing == 1
    assert m.errors == {"boom": 1}
    # numpy linear percentiles, by hand: sorted x, index p/100*(n-1)
    assert m.ttft_ms.model_dump() == pytest.approx(
        {"mean": 200.0, "p50": 200.0, "p90": 270.0, "p99": 297.0}
    )
    assert m.tpot_ms.model_dump() == pytest.approx(
        {"mean": 287.5 / 3, "p50": 100.0, "p90": 120.0, "p99": 124.5}
    )
    assert m.itl_ms.model_dump() == pytest.approx(
        {"mean": 112.5, "p50": 100.0, "p90": 170.0, "p99": 197.0}
    )
    assert m.e2e_ms.model_dump() == pytest.approx(
        {"mean": 350.0, "p50": 375.0, "p90": 435.0, "p99": 448.5}
    )
    assert m.goodput == pytest.approx(m.request_throughput) and m.slo_met == 4


def test_explicit_duration_is_used() -> None:
    m = compute_metrics(RECORDS, duration_s=2.0)
    assert m.duration_s == 2.0 and m.output_throughput == pytest.approx(5.5)


def test_goodput_every_slo() -> None:
    # TTFT <= 250 and TPOT <= 110: r1 and r3 (no TPOT cannot violate) meet both
    m = compute_metrics(RECORDS, slo=SLO(ttft_ms=250, tpot_ms=110))
    assert m.slo_met == 2 and m.goodput == pytest.approx(2 / 0.9)
    # adding E2E <= 300 leaves r3 only
    m = compute_metrics(RECORDS, slo=SLO(ttft_ms=250, tpot_ms=110, e2e_ms=300))
    assert m.slo_met == 1 and m.goodput == pytest.approx(1 / 0.9)


def test_extra_percentiles_and_slo_percentile() -> None:
    m = compute_metrics(RECORDS, percentiles=(50, 95), slo=SLO(ttft_ms=250, percentile=99.9))
    dumped = m.ttft_ms.model_dump()
    assert dumped["p95"] == pytest.approx(285.0)
    assert dumped["p99.9"] == pytest.approx(299.7)
    assert {"mean", "p50", "p90", "p99"} <= dumped.keys()
    assert m.ttft_ms.percentile(95) == pytest.approx(285.0)
    assert m.ttft_ms.percentile(12) is None


def test_slo_margins() -> None:
    m = compute_metrics(RECORDS, slo=SLO(tpot_ms=100, ttft_ms=250, percentile=90))
    assert slo_margins(m, SLO(tpot_ms=100, ttft_ms=250, percentile=90)) == pytest.approx(
        {"slo_ttft_p90_ms": 20.0, "slo_tpot_p90_ms": 20.0}
    )
    assert slo_margins(m, SLO(e2e_ms=500)) == pytest.approx({"slo_e2e_p99_ms": -51.5})
    one_token = compute_metrics([rec(0, 0.0, [0.1], 0.1, out=1)])
    assert slo_margins(one_token, SLO(tpot_ms=10)) == {"slo_tpot_p99_ms": math.inf}


def test_empty_and_all_failed() -> None:
    m = compute_metrics([])
    assert (m.completed, m.failed, m.output_throughput, m.error_rate) == (0, 0, 0.0, 0.0)
    assert m.ttft_ms.p99 is None and m.output_throughput_rse is None
    m = compute_metrics([rec(0, 0.0, [], 1.0, out=None, error="x")])
    assert (m.completed, m.failed, m.error_rate, m.output_tokens) == (0, 1, 1.0, 0)


def test_matches_numpy_on_random_records() -> None:
    rng = np.random.default_rng(0)
    records = []
    for i in range(200):
        send = float(rng.uniform(0, 10))
        gaps = rng.exponential(0.02, size=int(rng.integers(1, 20)))
        chunks = list(send + 0.1 + np.cumsum(gaps))
        records.append(rec(i, send, chunks, chunks[-1] + 0.001, out=3 * len(chunks)))
    m = compute_metrics(records)
    ttft = np.array([(r.chunk_times[0] - r.send_time) * 1000 for r in records])
    itl = np.concatenate([np.diff(r.chunk_times) * 1000 for r in records])
    assert m.ttft_ms.p99 == pytest.approx(float(np.percentile(ttft, 99)))
    assert m.itl_ms.p90 == pytest.approx(float(np.percentile(itl, 90)))
    assert m.itl_ms.mean == pytest.approx(float(itl.mean()))


def test_throughput_rse() -> None:
    # steady: one 5-token chunk every 10 ms over 1 s -> equal bins -> zero error
    steady = [rec(i, i / 100, [i / 100 + 0.005], i / 100 + 0.006, out=5) for i in range(100)]
    m = compute_metrics(steady, duration_s=1.0)
    assert m.output_throughput_rse == pytest.approx(0.0, abs=1e-12)
    # bursty: everything in the first tenth of the window
    bursty = [rec(i, 0.0, [0.001 * (i + 1)], 0.1, out=5) for i in range(50)]
    m = compute_metrics(bursty, duration_s=1.0)
    assert m.output_throughput_rse == pytest.approx(1.0)  # std/sqrt(10)/mean for one full bin
    assert compute_metrics(steady[:5], duration_s=1.0).output_throughput_rse is None


def test_rescale_time_converts_to_modeled_clock() -> None:
    from autotune.loadgen import rescale_time
    from autotune.loadgen.records import RequestRecord

    records = [
        RequestRecord(
            index=i,
            send_time=0.0,
            end_time=1.0,
            chunk_times=[0.2, 0.6, 1.0],
            prompt_tokens=10,
            completion_tokens=3,
            status=200,
        )
        for i in range(4)
    ]
    fast = compute_metrics(records, duration_s=1.0)
    slow = rescale_time(fast, 8.0)
    assert slow.output_throughput == pytest.approx(fast.output_throughput / 8)
    assert slow.request_throughput == pytest.approx(fast.request_throughput / 8)
    assert slow.duration_s == pytest.approx(8.0)
    assert fast.ttft_ms.p99 is not None and fast.tpot_ms.mean is not None
    assert slow.ttft_ms.p99 == pytest.approx(fast.ttft_ms.p99 * 8)
    assert slow.tpot_ms.mean == pytest.approx(fast.tpot_ms.mean * 8)
    assert slow.completed == fast.completed and slow.error_rate == fast.error_rate
    assert rescale_time(fast, 1.0) is fast
