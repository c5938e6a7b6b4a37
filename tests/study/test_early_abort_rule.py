"""early_abort_reason: when the measure phase of a trial that cannot win stops.

Figures from the H200 run (BENCHMARKS.md): the incumbent served 773.4 tok/s, a server that
takes one request at a time 30-45 tok/s (C=16, 128 output tokens: 3-4 s per request)."""

from __future__ import annotations

import pytest

from autotune.loadgen import LiveEstimate
from autotune.study.abort import early_abort_reason
from autotune.study.definition import EarlyAbortSettings

SETTINGS = EarlyAbortSettings(abort_below=0.8, margin_before_ci=0.5)
INCUMBENT = (773.4, 2)  # threshold 618.7 tok/s


def reason(
    *,
    elapsed: float,
    done: int,
    rate: float,
    half: float | None = None,
    settings: EarlyAbortSettings = SETTINGS,
    speedup: float = 1.0,
) -> str | None:
    return early_abort_reason(
        LiveEstimate(
            elapsed_s=elapsed, completed=done, output_throughput=rate, rel_half_width=half
        ),
        settings=settings,
        incumbent=INCUMBENT,
        streams=16,
        output_len=128,
        speedup=speedup,
    )


def test_interval_below_threshold_aborts() -> None:
    got = reason(elapsed=10, done=40, rate=500, half=0.1)  # upper 550 < 618.7
    assert got is not None and "upper 95% bound 550.0" in got
    assert reason(elapsed=10, done=40, rate=570, half=0.1) is None  # upper 627 >= 618.7


def test_whole_round_done_uses_the_margin() -> None:
    got = reason(elapsed=10, done=16, rate=150)  # max(150, 16*128/10=204.8) x 1.5 = 307.2
    assert got is not None and "(no interval yet) 307.2" in got
    assert reason(elapsed=3, done=16, rate=150) is None  # 682.7 x 1.5 >= 618.7


def test_one_request_at_a_time_is_cut_after_a_few_requests() -> None:
    # 3.5 s per request: 2 done after 7 s, 14 of the first round still out since t=0, so the
    # round's mean latency >= 14/16 x 7 s and throughput <= 16 x 128 / 6.125 s = 334.4 tok/s.
    got = reason(elapsed=7.0, done=2, rate=36.6)
    assert got is not None
    assert got.startswith("36.6 tok/s after 2 requests, first round unfinished after 7.0 s")
    assert "501.6 < 0.8 x incumbent #2 (773.4 tok/s)" in got


def test_nothing_done_is_never_cut() -> None:
    # However slow: with no completed request the trial has no figure to store, and an
    # aborted measure phase without one would be recorded as a failure (bench_failed).
    for elapsed in (5.0, 30.0, 120.0):
        assert reason(elapsed=elapsed, done=0, rate=0.0) is None, elapsed


def test_a_fast_server_early_in_its_first_round_is_kept() -> None:
    # Nothing finished yet after 1-4 s is what a batched server at the incumbent's speed
    # looks like (its round takes about 2.6 s): never cut.
    for elapsed in (0.5, 1.0, 2.6, 4.0):
        assert reason(elapsed=elapsed, done=0, rate=0.0) is None, elapsed


def test_a_server_at_the_incumbents_speed_is_never_cut_in_its_first_round() -> None:
    # Closed loop at 773.4 tok/s: requests of one round finish together at 2.65 s. At any
    # moment before, k = 0 and the bound is 16 x 128 / t > 773.4.
    round_s = 16 * 128 / 773.4
    for step in range(1, 100):
        t = round_s * step / 100
        assert reason(elapsed=t, done=0, rate=0.0) is None, t


def test_without_a_margin_nothing_is_cut_before_an_interval() -> None:
    none = EarlyAbortSettings(abort_below=0.8, margin_before_ci=None)
    assert reason(elapsed=30, done=2, rate=10, settings=none) is None
    assert reason(elapsed=30, done=16, rate=10, settings=none) is None
    assert reason(elapsed=30, done=2, rate=10, half=0.1, settings=none) is not None


@pytest.mark.parametrize("done", [0, 1, 15])
def test_no_time_elapsed_never_cuts(done: int) -> None:
    assert reason(elapsed=0.0, done=done, rate=0.0) is None


def test_wall_clock_is_converted_to_modeled_time() -> None:
    # A simulated deployment 8x faster than the hardware it models: 8 x 36.6 tok/s of wall
    # clock is 36.6 modeled, and the same bound applies.
    got = reason(elapsed=7.0 / 8, done=2, rate=36.6 * 8, speedup=8)
    assert got is not None and got.startswith("36.6 tok/s after 2 requests")


def test_the_bound_uses_the_datasets_longest_output_not_the_top_level_default() -> None:
    """Issue 28's H200 study: outputs 64-512 from a random dataset, top-level output_len left
    at its default 32. Judged by 32 tokens, a fast first round (1 of 64 requests done after
    1.8 s) looked capped at ~1,770 tok/s and was cut under an incumbent of 5,600; by 512
    it may reach ~18,500 and is kept."""
    from autotune.loadgen import LoadSpec
    from autotune.study.abort import BelowIncumbent

    load = LoadSpec.model_validate(
        {
            "concurrency": 64,
            "dataset": {
                "kind": "random",
                "input_len": 2048,
                "output_len": 512,
                "range_ratio": 0.125,
            },
        }
    )
    assert load.output_len == 32 and load.max_output_len == 512
    policy = BelowIncumbent(SETTINGS)
    est = LiveEstimate(elapsed_s=1.8, completed=1, output_throughput=0.0, rel_half_width=None)
    assert policy.reason(est, incumbent=(5627.5, 13), load=load) is None
    assert (
        early_abort_reason(
            est, settings=SETTINGS, incumbent=(5627.5, 13), streams=64, output_len=32
        )
        is not None
    )


def test_answers_of_unbounded_length_skip_the_first_round_bound() -> None:
    est = LiveEstimate(elapsed_s=30.0, completed=1, output_throughput=1.0, rel_half_width=None)
    assert (
        early_abort_reason(est, settings=SETTINGS, incumbent=(1e6, 1), streams=64, output_len=None)
        is None
    )
