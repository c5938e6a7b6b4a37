"""What the servers themselves counted during a measured phase (their Prometheus ``/metrics``).

The load generator sees the requests from outside; the engine's own counters say why a
configuration was fast or slow: KV-cache usage, preemptions, prefix-cache hits, speculative
acceptance, its own TTFT and TPOT (on a machine where client and server share the cores, the
server's figures are the ones that do not include the client's scheduling delays). Each
service with a ``metrics_url`` is scraped just before the measured phase, every
``interval_s`` during it (gauges) and just after; the window's summary is stored per trial.

The scraping runs on its own thread: the load generator's event loop only waits for the
first scrape (so the window starts where the measurement starts) and never does HTTP itself.
A failed scrape is noted and never fails a trial: the measurement is the load generator's.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from autotune.engines import EngineMetrics
from autotune.engines._prometheus import Scrape, parse, summarize

SCRAPE_TIMEOUT_S = 2.0
INTERVAL_S = 0.5
"""Gauges are read at most twice a second: a measured phase of a few seconds gets several."""
MAX_DUTY = 0.1
"""At most this share of the window is spent scraping: the next scrape waits 9x as long as the
last one took. A server busy with the load answers ``/metrics`` slowly (vLLM's API server,
the bottleneck on 2 cores, took ~1.3 s per scrape at C=16), and back-to-back scrapes would
take from the measured server the time they measure it with."""


@dataclass
class _Target:
    url: str
    names: dict[str, str]
    before: Scrape | None = None
    during: list[Scrape] = field(default_factory=list)
    error: str | None = None


class ServerMetricsWatch:
    """Scrapes ``targets`` (service -> (metrics URL, the engine's metric names)) around one
    measured phase: :meth:`begin` when it starts, :meth:`end` when it is over."""

    def __init__(
        self,
        targets: Mapping[str, tuple[str, EngineMetrics]],
        *,
        interval_s: float = INTERVAL_S,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        cpus: frozenset[int] | None = None,
    ) -> None:
        """``cpus``: where the scraping thread runs (``None``: anywhere); a deployment that
        keeps ``client_cpus`` for the load generator keeps the scraper off them too."""
        named = {name: (url, metrics.names()) for name, (url, metrics) in targets.items()}
        self._targets = {
            name: _Target(url=url, names=names) for name, (url, names) in named.items() if names
        }
        self._interval_s = interval_s
        self._cpus = cpus
        self._timeout = httpx.Timeout(timeout_s)
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self.summary: dict[str, dict[str, float | str]] = {}
        """Service -> the window's summary, set by :meth:`end` (or leaving ``with``)."""

    def __enter__(self) -> ServerMetricsWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def begin(self) -> None:
        """Take the first scrape of every service (waits for it), then keep sampling."""
        if not self._targets or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="server-metrics", daemon=True)
        self._thread.start()
        self._started.wait(len(self._targets) * (self._timeout.read or SCRAPE_TIMEOUT_S) + 1)

    def end(self) -> dict[str, dict[str, float | str]]:
        """Stop sampling, take the last scrape, and summarise the window per service (a
        service whose scrapes failed gets ``{"error": ...}``). Empty when never begun;
        a second call returns the first one's summary."""
        if self._thread is None or self._stop.is_set():
            return self.summary
        self._stop.set()
        self._thread.join()
        out: dict[str, dict[str, float | str]] = {}
        with self._client() as client:
            for name, target in self._targets.items():
                after = self._scrape(client, target)
                if target.before is None or after is None:
                    out[name] = {"error": target.error or "no scrape"}
                    continue
                out[name] = dict(summarize(target.names, target.before, after, target.during))
        self.summary = out
        return out

    # ------------------------------------------------------------------ the thread

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=self._timeout, trust_env=False, follow_redirects=False)

    def _run(self) -> None:
        if self._cpus is not None:
            os.sched_setaffinity(0, self._cpus)  # this thread only
        with self._client() as client:
            for target in self._targets.values():
                target.before = self._scrape(client, target)
            self._started.set()
            took = 0.0
            while not self._stop.wait(max(self._interval_s, took * (1 - MAX_DUTY) / MAX_DUTY)):
                began = time.monotonic()
                for target in self._targets.values():
                    scrape = self._scrape(client, target)
                    if scrape is not None:
                        target.during.append(scrape)
                took = time.monotonic() - began

    def _scrape(self, client: httpx.Client, target: _Target) -> Scrape | None:
        try:
            response = client.get(target.url)
        except httpx.HTTPError as exc:
            target.error = f"GET {target.url}: {type(exc).__name__}: {exc}"
            return None
        if response.status_code != 200:
            target.error = f"GET {target.url}: HTTP {response.status_code}"
            return None
        return parse(response.text)


def on_modeled_clock(
    summary: dict[str, dict[str, float | str]], factor: float
) -> dict[str, dict[str, float | str]]:
    """``summary`` with its durations (``*_s``) multiplied by ``factor``: a simulated server
    running ``factor`` times faster than the hardware it models times itself on the fast
    clock (as :func:`autotune.loadgen.rescale_time` does for the client's figures)."""
    if factor == 1.0:
        return summary
    return {
        service: {
            k: v * factor if k.endswith("_s") and isinstance(v, float) else v
            for k, v in values.items()
        }
        for service, values in summary.items()
    }
