"""run_load against a real misbehaving server: bounded time, BenchError or failed records."""

from __future__ import annotations

import gc
import os
import re

import pytest
from fault_fixtures import TIMEOUT_S, StartServer, Timer
from faulty_server import BAD_STREAM_EVENTS

from autotune.errors import BenchError
from autotune.loadgen import LoadSpec, run_load

BOUND_S = TIMEOUT_S + 3.0
HANGS = ("hang", "hang_all", "stall_mid_stream", "drip", "slow_headers")
TIMED_OUT = rf"timed out after {TIMEOUT_S:g} s \(request_timeout_s\)"
LOST = r"(connection reset by|invalid or truncated HTTP response from|connection to .* lost)"
# What a request that met each fault reports (warm-up error text or measured record error).
REQUEST_ERROR = {
    "crash": LOST,
    "hang": TIMED_OUT,
    "hang_all": TIMED_OUT,
    "stall_mid_stream": TIMED_OUT,
    "drip": TIMED_OUT,
    "slow_headers": TIMED_OUT,
    "http_500": r"HTTP 500: .*fault injected",
    "http_429": r"HTTP 429: .*too many requests",
    "error_event": r"server error: fault injected: engine error \(500\)",
    "malformed": r"malformed event \(not JSON\): \{not json",
    "bad_shape": r"malformed event \('choices' is dict, not a list\)",
    "no_done": r"stream ended before 'data: \[DONE\]'",
    "reset": r"connection reset by http://127\.0\.0\.1:\d+ \(ReadError",
    "garbage": r"invalid or truncated HTTP response from .*RemoteProtocolError",
    "html": r"stream ended before 'data: \[DONE\]' \(not an event stream: content-type "
    r"text/html; charset=utf-8; <html><head><title>502 Bad Gateway",
    "binary": r"malformed event \(not JSON\): \{\"choices\": \[\{\"text\": \"\ufffd",
}
FAULTS = sorted(REQUEST_ERROR)


def spec(**kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "concurrency": 2,
        "input_len": 8,
        "output_len": 8,
        "requests": 4,
        "warmup_requests": 2,
        "request_timeout_s": TIMEOUT_S,
        "max_duration_s": 10.0,
    }
    return LoadSpec.model_validate({**base, **kw})


@pytest.mark.parametrize("fault", FAULTS)
def test_warmup_fault_raises_bench_error_then_a_fresh_server_works(
    start_server: StartServer, fault: str
) -> None:
    bad = start_server(fault)
    with Timer() as t, pytest.raises(BenchError) as info:
        run_load(bad.url, spec())
    assert t.seconds < BOUND_S
    message = str(info.value)
    if fault == "hang_all":  # even /v1/models hangs: the model name is never learnt
        assert f"GET {bad.url}/v1/models timed out after {TIMEOUT_S:g} s" in message
    else:
        assert message.startswith(f"warm-up request to {bad.url} failed: "), message
        assert any(
            re.search(pattern, message) for pattern in (REQUEST_ERROR[fault], r"cannot connect to")
        ), message
    if fault == "crash":
        assert bad.proc.wait(5) == 3  # it really died (os._exit(3)) mid-stream
    else:
        assert bad.alive()
    # Nothing leaks into the next trial: a healthy server right after measures cleanly.
    good = start_server("ok")
    result = run_load(good.url, spec())
    assert result.metrics.completed == 4 and result.metrics.failed == 0
    assert result.stop_reason is None


@pytest.mark.parametrize("fault", FAULTS)
def test_measure_fault_is_recorded_not_raised(start_server: StartServer, fault: str) -> None:
    # Warm-up (2) and the first 2 measured requests are healthy, the last 2 meet the fault.
    # One worker for crash (the process dies: concurrent healthy streams would die too).
    concurrency = 1 if fault == "crash" else 4
    bad = start_server(fault, after=4)
    with Timer() as t:
        result = run_load(bad.url, spec(concurrency=concurrency, warmup_requests=2))
    assert t.seconds < BOUND_S
    ok = [r for r in result.records if r.ok]
    failed = [r for r in result.records if not r.ok]
    assert [r.text for r in ok] == [" w0 w1 w2 w3 w4 w5 w6 w7"] * 2
    assert len(failed) == 2
    pattern = REQUEST_ERROR[fault]
    if fault == "crash":  # the request that crashed it, then one that finds nobody listening
        pattern = rf"{LOST}|cannot connect to"
    elif fault == "bad_shape":  # each faulty request gets the next wrong shape
        pattern = r"^malformed event \("
    for record in failed:
        assert record.error is not None
        assert re.search(pattern, record.error), record.error
    if fault in ("http_500", "http_429"):
        assert [r.status for r in failed] == [int(fault[-3:])] * 2
    if fault in HANGS:  # timed-out requests keep their own latency, bounded by the timeout
        assert all(TIMEOUT_S - 0.05 <= r.latency_s < TIMEOUT_S + 1.0 for r in failed)
    assert result.metrics.failed == 2 and result.metrics.error_rate == pytest.approx(0.5)


def test_every_bad_shape_is_a_malformed_event(start_server: StartServer) -> None:
    n = len(BAD_STREAM_EVENTS)
    bad = start_server("bad_shape", after=1)
    result = run_load(bad.url, spec(concurrency=1, warmup_requests=0, requests=n + 1))
    errors = [r.error for r in result.records]
    assert errors[0] is None
    assert all(e is not None and e.startswith("malformed event (") for e in errors[1:]), errors
    reasons = {e.split(")")[0] for e in errors[1:] if e}
    assert len(reasons) >= 6, reasons  # each shape is named, not lumped together


def test_chat_api_against_faults(start_server: StartServer) -> None:
    bad = start_server("bad_shape", after=2)
    result = run_load(bad.url, spec(api="chat", concurrency=1, warmup_requests=0, requests=3))
    assert [r.ok for r in result.records] == [True, True, False]
    assert result.records[0].text == " w0 w1 w2 w3 w4 w5 w6 w7"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.parametrize("fault", ["drip", "reset"])
def test_no_socket_leaks_after_a_fault(start_server: StartServer, fault: str) -> None:
    bad = start_server(fault, after=2)
    assert run_load(bad.url, spec(warmup_requests=0, concurrency=4)).metrics.failed == 2
    gc.collect()  # sockets of earlier tests, closed by the collector, must not skew the count
    before = _open_fds()
    with pytest.raises(BenchError, match="all 4 measured requests"):
        run_load(bad.url, spec(warmup_requests=0, concurrency=4))
    gc.collect()
    assert _open_fds() <= before
