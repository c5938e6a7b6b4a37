"""The open loop's pacer: an armed write fires once, from a stream read when it is due."""

from __future__ import annotations

import math
from time import perf_counter

import pytest
from fake_openai_server import FakeServer

from autotune.loadgen import LoadSpec, run_load
from autotune.loadgen import _loops as loadgen_loops
from autotune.loadgen import client as loadgen_client
from autotune.loadgen.client import _Attempt, _Stream
from autotune.loadgen.pacer import Pacer

CHUNK = b'data: {"choices": [{"text": "a", "index": 0}]}\n\n'


def test_an_armed_write_fires_once_and_disarms() -> None:
    pacer, calls = Pacer(), []
    assert not pacer.armed and pacer.due == math.inf
    pacer.arm(5.0, lambda: calls.append("w"))
    assert pacer.armed and pacer.due == 5.0
    pacer.fire()
    pacer.fire()
    assert calls == ["w"] and not pacer.armed and pacer.due == math.inf
    pacer.arm(6.0, lambda: calls.append("x"))
    pacer.disarm()
    pacer.fire()
    assert calls == ["w"]


def test_a_stream_read_fires_the_write_only_when_it_is_due() -> None:
    pacer, calls = Pacer(), []
    stream = _Stream(_Attempt(), False, None, pacer=pacer)
    stream.head(200, {"content-type": "text/event-stream"})
    pacer.arm(perf_counter() + 60.0, lambda: calls.append("later"))
    stream.data(CHUNK)
    assert calls == [] and pacer.armed  # not due: the read leaves it alone
    pacer.arm(perf_counter() - 1e-3, lambda: calls.append("due"))
    stream.data(CHUNK)
    assert calls == ["due"] and pacer.from_reads == 1 and not pacer.armed
    assert stream.att.pieces == ["a", "a"]  # the read itself is parsed as ever


@pytest.mark.parametrize("pace", [True, False])
def test_the_open_loop_keeps_its_schedule_with_and_without_the_pacer(
    fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch, pace: bool
) -> None:
    # Many streams in flight (each request ~0.2 s at 150 req/s), so requests fall due while
    # chunks arrive. Both ways every request is sent on its schedule and answered. Whether a
    # read or the dispatcher made a write depends on how the server batches its chunks (a
    # batched decode step, as the twin's and real engines', makes every stream readable at
    # once); the lag figures are the benchmark's (benchmarks/send_lag.py).
    monkeypatch.setattr(loadgen_client._OpenLoop, "PACE", pace)
    made: list[Pacer] = []

    class Spy(Pacer):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(loadgen_loops, "Pacer", Spy)  # the open loop makes its pacer there
    fake_server.behaviour.chunk_delay_s = 0.02
    spec = LoadSpec(
        input_len=16,
        output_len=10,
        warmup_requests=0,
        requests=60,
        request_rate=150.0,
        request_timeout_s=20,
    )
    result = run_load(fake_server.url, spec)
    assert (result.metrics.completed, result.metrics.failed) == (60, 0)
    assert fake_server.max_in_flight > 5
    for r in result.records:
        assert r.due_time is not None and r.send_time >= r.due_time
    lag = result.metrics.send_lag_ms
    assert lag is not None and lag.p50 is not None and lag.p50 < 50.0  # busy-machine bound
    assert len(made) == (1 if pace else 0)
    if pace:
        assert not made[0].armed  # nothing left armed after the phase
