"""The server-metrics watch: a window of scrapes around the measured phase, never a reason
to fail a trial."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from autotune.cpus import available_cpus
from autotune.engines import get_engine
from autotune.trial.server_metrics import ServerMetricsWatch, on_modeled_clock

DATA = Path(__file__).resolve().parents[1] / "engines" / "data" / "vllm-0.32.0"


class _Metrics(BaseHTTPRequestHandler):
    """Answers the real 'before' scrape first, the real 'after' scrape from then on."""

    pages: list[bytes] = []
    served = 0
    delay_s = 0.0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        cls = type(self)
        time.sleep(cls.delay_s)
        body = cls.pages[min(cls.served, len(cls.pages) - 1)]
        cls.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_url() -> Iterator[str]:
    _Metrics.pages = [
        (DATA / "metrics-before.txt").read_bytes(),
        (DATA / "metrics-after.txt").read_bytes(),
    ]
    _Metrics.served = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_the_window_starts_at_begin_and_ends_at_end(metrics_url: str) -> None:
    vllm = get_engine("vllm")
    with ServerMetricsWatch({"server": (metrics_url, vllm.metrics)}, interval_s=0.05) as watch:
        watch.begin()
        assert _Metrics.served == 1  # begin waited for the first scrape
        threading.Event().wait(0.2)
    window = watch.summary["server"]
    assert window["generation_tokens"] == 32 * 64
    kv_usage_max = window["kv_usage_max"]
    assert not isinstance(kv_usage_max, str)  # a gauge, not an error
    assert kv_usage_max >= 0 and "running_mean" in window  # sampled in between
    assert watch.end() is watch.summary  # a second end changes nothing


def test_an_unreachable_server_is_noted_not_raised() -> None:
    vllm = get_engine("vllm")
    watch = ServerMetricsWatch({"server": ("http://127.0.0.1:9/metrics", vllm.metrics)})
    with watch:
        watch.begin()
    assert "error" in watch.summary["server"]
    assert "127.0.0.1:9" in str(watch.summary["server"]["error"])


def test_never_begun_or_without_metric_names_it_stores_nothing(metrics_url: str) -> None:
    with ServerMetricsWatch({"server": (metrics_url, get_engine("vllm").metrics)}) as watch:
        pass  # the load failed before its measured phase
    assert watch.summary == {}
    generic = ServerMetricsWatch({"x": (metrics_url, get_engine("generic").metrics)})
    assert not generic._targets


def test_a_simulated_server_times_itself_on_the_fast_clock() -> None:
    summary: dict[str, dict[str, float | str]] = {
        "decode": {"ttft_mean_s": 0.01, "ttft_count": 8.0, "preemptions": 1.0}
    }
    assert on_modeled_clock(summary, 10.0) == {
        "decode": {"ttft_mean_s": pytest.approx(0.1), "ttft_count": 8.0, "preemptions": 1.0}
    }
    assert on_modeled_clock(summary, 1.0) is summary


def test_a_slow_server_is_scraped_less_often(metrics_url: str) -> None:
    """A server slow to answer ``/metrics`` (busy with the load) is not scraped back to back:
    the watch waits 9x the last scrape's time (at most 10% of the window scraping)."""
    _Metrics.delay_s = 0.1
    try:
        with ServerMetricsWatch(
            {"server": (metrics_url, get_engine("vllm").metrics)}, interval_s=0.01
        ) as watch:
            watch.begin()
            threading.Event().wait(2.0)
    finally:
        _Metrics.delay_s = 0.0
    # back to back: ~20 scrapes in 2 s; with the back-off: one per >= 1 s (0.1 s + 0.9 s)
    assert 1 <= _Metrics.served - 2 <= 3, _Metrics.served
    assert watch.summary["server"]["generation_tokens"] == 32 * 64


@pytest.mark.skipif(len(available_cpus()) < 2, reason="needs two CPUs")
def test_the_scraper_runs_on_the_cpus_it_is_given(metrics_url: str) -> None:
    """With client_cpus, the scraping thread stays off the load generator's CPUs; the
    caller's own thread keeps its affinity."""
    seen: list[frozenset[int]] = []
    caller = threading.get_ident()

    class Spy(ServerMetricsWatch):
        def _scrape(self, client, target):  # type: ignore[no-untyped-def]
            if threading.get_ident() != caller:  # the last scrape is end()'s, after the load
                seen.append(frozenset(os.sched_getaffinity(0)))
            return super()._scrape(client, target)

    mine = available_cpus()
    apart = frozenset({max(mine)})
    with Spy({"server": (metrics_url, get_engine("vllm").metrics)}, cpus=apart) as watch:
        watch.begin()
    assert seen and all(s == apart for s in seen)
    assert available_cpus() == mine
