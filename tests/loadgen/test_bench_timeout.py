"""BenchTimeout: the server answered nothing in time, as opposed to answering with errors.

The tuning loop looks at a live server's log for torch.compile only after a BenchTimeout,
so a silent server must raise it and a server that answers with errors must not.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fake_openai_server import FakeServer

from autotune.errors import BenchError, BenchTimeout
from autotune.loadgen import LoadSpec, run_load


def spec(**kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "model": "m",  # no /v1/models lookup: the first request is a completion
        "concurrency": 2,
        "input_len": 8,
        "output_len": 4,
        "warmup_requests": 2,
        "requests": 4,
        "max_duration_s": 0.5,
        "request_timeout_s": 10,
    }
    base.update(kw)
    return LoadSpec.model_validate(base)


@pytest.fixture
def silent_url() -> Iterator[str]:
    """Accepts TCP connections and reads the requests, never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()
    assert accepted, "the client never connected"


class _Http500Server(ThreadingHTTPServer):
    """Counts the POSTs it was sent. Per server, not per handler class: a handler thread of
    the previous test's server (daemon threads outlive ``shutdown()``) may still finish a
    request after this test's server started (seen in a clean-clone run: 5 == 4)."""

    posts = 0


class _Http500(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Http500Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts += 1
        body = b'{"error": {"message": "internal error", "code": 500}}'
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # The client may give up on the first 500 and close before the body is out: the
        # broken pipe is expected, not a traceback for the test log.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http500() -> Iterator[_Http500Server]:
    """Answers every POST at once with HTTP 500."""
    server = _Http500Server(("127.0.0.1", 0), _Http500)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _url(server: _Http500Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_bench_timeout_is_a_bench_error() -> None:
    assert issubclass(BenchTimeout, BenchError)


def test_silent_server_times_out_the_warm_up(silent_url: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(BenchTimeout, match=r"warm-up did not finish within max_duration_s=0\.5"):
        run_load(silent_url, spec())
    assert time.perf_counter() - t0 < 3  # capped by max_duration_s, not request_timeout_s


def test_headers_then_silence_times_out_the_warm_up(fake_server: FakeServer) -> None:
    # 200 and the SSE headers, then nothing: a server busy compiling its first forward pass.
    fake_server.behaviour.mode = "hang"
    with pytest.raises(BenchTimeout, match=r"\(0 of 2 warm-up requests .* finished in"):
        run_load(fake_server.url, spec())
    assert fake_server.requests == 2  # both warm-up requests were sent


def test_trial_deadline_during_warm_up_is_a_timeout(silent_url: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(BenchTimeout, match="trial deadline reached during warm-up"):
        run_load(silent_url, spec(max_duration_s=30), deadline=time.monotonic() + 0.4)
    assert time.perf_counter() - t0 < 3


def test_nothing_completed_in_the_measure_phase_is_a_timeout(fake_server: FakeServer) -> None:
    fake_server.behaviour.mode = "hang"
    with pytest.raises(BenchTimeout, match=r"no request .* completed within max_duration_s=0\.3"):
        run_load(fake_server.url, spec(warmup_requests=0, max_duration_s=0.3))


def test_aborted_measure_phase_is_not_a_timeout(fake_server: FakeServer) -> None:
    fake_server.behaviour.mode = "hang"
    with pytest.raises(BenchError, match="aborted") as info:
        run_load(
            fake_server.url,
            spec(warmup_requests=0, max_duration_s=5),
            abort_if=lambda est: "hopeless",
        )
    assert not isinstance(info.value, BenchTimeout)
    assert "hopeless" in str(info.value)


def test_http_500_in_warm_up_is_not_a_timeout(http500: _Http500Server) -> None:
    with pytest.raises(BenchError, match=r"warm-up request .* failed: .*HTTP 500") as info:
        run_load(_url(http500), spec())
    assert not isinstance(info.value, BenchTimeout)
    assert http500.posts >= 1


def test_http_500_in_measure_phase_is_not_a_timeout(http500: _Http500Server) -> None:
    with pytest.raises(BenchError, match=r"all 4 measured requests .* failed; .*HTTP 500") as info:
        run_load(_url(http500), spec(warmup_requests=0))
    assert not isinstance(info.value, BenchTimeout)
    assert http500.posts == 4


def test_request_timeout_before_the_cap_is_still_a_timeout(silent_url: str) -> None:
    # request_timeout_s shorter than max_duration_s: the warm-up request times out on its own
    # (the default LoadSettings are so: 60 s vs 120 s). Still nothing answered: a stall.
    with pytest.raises(BenchTimeout, match=r"warm-up request .* failed: timed out after 0\.3 s"):
        run_load(silent_url, spec(max_duration_s=5, request_timeout_s=0.3))


def test_every_measured_request_timing_out_is_a_timeout(fake_server: FakeServer) -> None:
    fake_server.behaviour.mode = "hang"
    with pytest.raises(BenchTimeout, match=r"all \d+ measured requests .* failed; .*timed out"):
        run_load(fake_server.url, spec(warmup_requests=0, max_duration_s=5, request_timeout_s=0.3))


def test_a_request_that_got_tokens_then_timed_out_is_not_unanswered() -> None:
    from autotune.loadgen.client import _unanswered
    from autotune.loadgen.records import RequestRecord

    def record(**kw: object) -> RequestRecord:
        base: dict[str, object] = {"index": 0, "send_time": 0.0, "end_time": 1.0}
        base.update(kw)
        return RequestRecord.model_validate(base)

    timed_out = "timed out after 0.3 s (request_timeout_s)"
    assert _unanswered(record(error=timed_out))
    assert not _unanswered(record(error=timed_out, chunk_times=[0.1]))  # it was answering
    assert not _unanswered(record(error="HTTP 500: internal error"))
    assert not _unanswered(record(error="cannot connect to http://x: connection refused"))
