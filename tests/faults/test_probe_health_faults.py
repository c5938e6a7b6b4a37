"""probe_text and the launcher's HealthProber against a real misbehaving server."""

from __future__ import annotations

import socket
import time

import pytest
from fault_fixtures import TIMEOUT_S, StartServer, Timer
from faulty_server import BAD_BODIES, MODEL, MODES

from autotune.errors import BenchError
from autotune.launch.health import HealthProber
from autotune.loadgen import probe_text

BOUND_S = TIMEOUT_S + 3.0
TIMED_OUT = rf"timed out after {TIMEOUT_S:g} s \(POST /v1/completions\)"
PROBE_ERROR = {
    "crash": r"failed: invalid or truncated HTTP response .*Server disconnected",
    "hang": TIMED_OUT,
    "hang_all": rf"timed out after {TIMEOUT_S:g} s \(GET /v1/models\)",
    "stall_mid_stream": TIMED_OUT,
    "drip": TIMED_OUT,
    "slow_headers": TIMED_OUT,
    "http_500": r"answered HTTP 500: .*fault injected",
    "http_429": r"answered HTTP 429: .*too many requests",
    "error_event": r": server error: fault injected: engine error \(500\)",
    "malformed": r": unexpected answer \{not json",
    "bad_shape": r": unexpected answer \{\"choices\": \{\"0\"",
    "no_done": r"failed: invalid or truncated HTTP response .*received \d+ bytes, expected 400",
    "reset": r"failed: connection reset by",
    "garbage": r"failed: invalid or truncated HTTP response .*RemoteProtocolError",
    "html": r": unexpected answer <html><head><title>502 Bad Gateway",
    "binary": r": unexpected answer \{\"choices\": \[\{\"text\": \"\ufffd",
}


def test_every_mode_is_covered() -> None:
    assert set(PROBE_ERROR) == set(MODES) - {"ok"}


@pytest.mark.parametrize("fault", sorted(PROBE_ERROR))
def test_probe_raises_bench_error_naming_the_fault(start_server: StartServer, fault: str) -> None:
    bad = start_server(fault)
    with Timer() as t, pytest.raises(BenchError, match=PROBE_ERROR[fault]) as info:
        probe_text(bad.url, prompt="hi", max_tokens=3, timeout_s=TIMEOUT_S)
    assert t.seconds < BOUND_S
    assert str(info.value).startswith(f"probe request to {bad.url}")
    good = start_server("ok")
    assert probe_text(good.url, prompt="hi", max_tokens=3, api="chat") == " w0 w1 w2"


def test_probe_every_bad_shape(start_server: StartServer) -> None:
    bad = start_server("bad_shape")
    for _ in BAD_BODIES:
        with pytest.raises(BenchError, match=r"unexpected answer|no text in answer"):
            probe_text(bad.url, prompt="hi", max_tokens=3, model=MODEL, timeout_s=TIMEOUT_S)


def test_probe_model_listing_faults(start_server: StartServer) -> None:
    bad = start_server("bad_shape", scope="all")
    for _ in range(3):  # {"choices": {...}}, then text 42, then message "x": none has data[0].id
        with pytest.raises(BenchError, match=r"/v1/models returned no model id"):
            probe_text(bad.url, prompt="hi", max_tokens=3, timeout_s=TIMEOUT_S)


def test_probe_deadline_caps_the_call(start_server: StartServer) -> None:
    bad = start_server("hang")
    with Timer() as t, pytest.raises(BenchError, match="trial deadline reached during POST"):
        probe_text(
            bad.url, prompt="hi", max_tokens=3, timeout_s=30, deadline=time.monotonic() + 0.4
        )
    assert 0.35 < t.seconds < 3.0  # not the 30 s timeout; room for a busy machine
    with pytest.raises(BenchError, match="trial deadline reached"):
        probe_text(bad.url, prompt="hi", max_tokens=3, deadline=time.monotonic() - 1)


# HealthProber (the launcher's readiness gate and /server_info fetch), every endpoint broken.
# A loopback connect is instant on an idle machine, but CI's busy workers have starved this
# process past a 0.2 s connect limit ("ConnectTimeout" on a healthy server): the limits keep
# the launcher's shape (short connect, longer read) with headroom for a loaded machine.
CONNECT_S, READ_S = 1.0, 1.0
HEALTH_BOUND_S = CONNECT_S + READ_S + 1.0
# Whether /health reads as ready: a 200 status line arrived (body faults don't matter);
# None where the outcome depends on timing (a reset racing the status line).
HEALTH_OK: dict[str, bool | None] = {
    "ok": True,
    "crash": False,
    "hang": False,
    "hang_all": False,
    "stall_mid_stream": True,
    "drip": True,
    "http_500": False,
    "http_429": False,
    "error_event": True,
    "malformed": True,
    "bad_shape": True,
    "no_done": True,
    "reset": None,
    "slow_headers": False,
    "garbage": False,
    "html": True,
    "binary": True,
}


@pytest.mark.parametrize("fault", sorted(HEALTH_OK))
def test_health_probe_and_info_are_bounded_and_never_raise(
    start_server: StartServer, fault: str
) -> None:
    served = start_server(fault, scope="all")
    prober = HealthProber(connect_timeout_s=CONNECT_S, read_timeout_s=READ_S)
    with Timer() as t:
        result = prober.probe(served.url + "/health")
    assert t.seconds < HEALTH_BOUND_S
    if HEALTH_OK[fault] is not None:
        assert result.ok is HEALTH_OK[fault], result
    if not result.ok:
        assert result.detail or result.status_code
    if fault in ("hang", "hang_all", "slow_headers"):
        assert "no answer" in result.detail, result  # per-read or total limit
    if fault == "crash":
        return  # the probe killed it
    with Timer() as t:
        info = prober.fetch_json(served.url + "/server_info")
    assert t.seconds < HEALTH_BOUND_S
    if fault == "ok":
        assert info == {"version": "faulty", "model_path": MODEL, "tp_size": 1}
    elif fault != "bad_shape":  # a wrong-shaped object is still an object
        assert info is None


def test_health_probe_sees_readiness_and_status(start_server: StartServer) -> None:
    served = start_server("ok", ready_delay=1.0)
    with HealthProber(connect_timeout_s=CONNECT_S, read_timeout_s=READ_S) as prober:
        first = prober.probe(served.url + "/health")
        assert (first.ok, first.status_code) == (False, 503)
        time.sleep(1.1)
        assert prober.probe(served.url + "/health").ok
        assert prober.fetch_json(served.url + "/get_server_info") is not None
        assert prober.fetch_json(served.url + "/nope") is None


def test_health_probe_of_a_dead_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = HealthProber().probe(f"http://127.0.0.1:{port}/health")
    assert not result.ok and result.status_code is None and "ConnectError" in result.detail
