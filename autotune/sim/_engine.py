"""The simulated server's engine: SGLang's scheduler and model runner, timed by the model.

:class:`Engine` queues requests, runs prefill forwards (``prefill`` mode) or the decode
loop (``decode``; ``null`` prefills admitted requests in the same loop), sleeps what
``perf_model`` says each forward takes, writes every running request's tokens of a step,
keeps the radix prefix cache, and counts what ``/metrics`` reports. Separate from
``server`` because it is the one piece that holds the process's scheduling state and
knows no HTTP route: the handlers hand it a :class:`Req` and wait for it.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import random
import time

from autotune.sim import perf_model as pm
from autotune.sim import text
from autotune.sim._log import Log
from autotune.sim._request import Req
from autotune.sim.args import SimConfig
from autotune.sim.metrics import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
    render_metrics,
    scheduler_labels,
    tokenizer_labels,
)
from autotune.sim.prefix_cache import PrefixCache

DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
SLOT_TOKENS = pm.KV_SLOT_TOKENS  # nominal tokens per KV slot, for sglang:token_usage
WRITE_BUFFER_LIMIT = 4 * 2**20  # a stream whose client stops reading is aborted


class Engine:
    """Scheduler + model runner of one server, driven by the perf model."""

    def __init__(self, cfg: SimConfig, log: Log) -> None:
        self.cfg = cfg
        self.log = log
        self.mode = cfg.disaggregation_mode
        self.cap = max(1, pm.running_cap(cfg)) if self.mode != "prefill" else 1
        self.wrong = pm.serves_wrong_text(cfg)
        self.accept = pm.accept_probabilities(cfg)
        self.accept_seeded = pm.accept_probabilities(cfg, seeded=True)
        self.accept_unseeded = pm.accept_probabilities(cfg, seeded=False)
        self.drafts = bool(self.accept_seeded)
        """This server runs the speculative algorithm (a prefill then hands over its draft
        state with the KV: disaggregation/prefill.py, speculative/eagle_disaggregation.py)."""
        self.chunk = int(pm.resolve(cfg)["chunked_prefill_size"])  # type: ignore[call-overload]
        seed = cfg.sim_seed if cfg.sim_seed is not None else int.from_bytes(os.urandom(8), "big")
        self.rng = random.Random(seed)
        self.noise = math.exp(self.rng.gauss(0.0, cfg.sim_noise)) if cfg.sim_noise > 0 else 1.0
        self.jitter = min(0.01, cfg.sim_noise / 3)
        self.queue: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.wake = asyncio.Event()
        self.model_name = cfg.served_model_name or cfg.model_path
        # tokenizer counters per is_streaming value ("true"/"false"), as SGLang labels them
        self.prompt_tokens: dict[str, int] = {}
        self.generation_tokens: dict[str, int] = {}
        self.num_requests: dict[str, int] = {}
        self.generation_tokens_total = 0
        self.steps = 0
        self.accept_tokens = 0
        self.accept_slots = 0
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
            extra_label="is_streaming",
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            E2E_BUCKETS,
            extra_label="is_streaming",
        )
        self._scheduler_labels = scheduler_labels(self.model_name, self.mode)
        self._tokenizer_labels = tokenizer_labels(self.model_name, self.mode)
        self._tp_window: collections.deque[tuple[float, int]] = collections.deque()
        self.stream_interval = 1
        """SGLang's ``--stream-interval``: stream a chunk every this many tokens (and the
        first and last ones); 1 (the default) streams every decode step."""
        self.cache: PrefixCache | None = None
        """The radix cache (None when ``disable_radix_cache`` resolves True: speculative
        decoding, a PD decode server, or the flag), bounded by the KV pool's tokens."""
        if pm.radix_cache_enabled(cfg):
            self.cache = PrefixCache(pm.kv_capacity_tokens(cfg), pm.prefix_cache_page(cfg))
        self.page = pm.prefix_cache_page(cfg)
        self.queued_tokens = 0  # prompt tokens of the queued requests (#pending-token)
        self.cached_tokens: dict[str, int] = {}  # sglang:cached_tokens_total by cache_source
        self.cache_hit_rate = 0.0  # the last prefill batch's, as SGLang's gauge
        self._last_prefill_log = time.perf_counter()

    # ---- intake ----
    def submit(self, req: Req) -> None:
        key = "true" if req.stream else "false"
        self.prompt_tokens[key] = self.prompt_tokens.get(key, 0) + req.n_prompt
        self.queued_tokens += req.n_prompt
        self.queue.append(req)
        self.wake.set()

    def finished(self, req: Req) -> None:
        """Per-request tokenizer metrics, once the request's response is complete."""
        key = "true" if req.stream else "false"
        self.num_requests[key] = self.num_requests.get(key, 0) + 1
        self.e2e.observe(time.monotonic() - req.t_arrive, 1, key)
        if req.cached > 0:  # no hierarchical cache: every hit is on the device
            self.cached_tokens["device"] = self.cached_tokens.get("device", 0) + req.cached

    # ---- prefix cache ----
    def _match(self, req: Req) -> int:
        """Lock the request's cached prefix (at most n - 1 tokens, whole pages) and count
        it as prefilled; returns the cached tokens (SGLang matches when it schedules the
        request's first chunk)."""
        req.matched = True
        if self.cache is None or not req.pages:
            return 0
        req.held = self.cache.acquire(req.pages, (req.n_prompt - 1) // self.page)
        req.cached = req.held * self.page
        return req.cached

    def _cache_prompt(self, req: Req) -> None:
        """After its prefill: the prompt's pages enter the cache, locked while it runs."""
        if self.cache is not None and req.pages:
            req.held = self.cache.extend(req.pages, req.held)

    def _release(self, req: Req) -> None:
        if self.cache is not None and req.held:
            self.cache.release(req.pages, req.held)
            req.held = 0

    def _retire(self) -> None:
        """Drop finished requests from the running batch (unlocking their cached pages)."""
        if self.cache is not None:
            for r in self.running:
                if r.held and r.done.done():
                    self._release(r)
        self.running = [r for r in self.running if not r.done.done()]

    def idle(self) -> bool:
        """No running request and none waiting (SGLang's ``is_fully_idle``)."""
        return not self.running and all(r.done.done() for r in self.queue)

    def flush(self) -> bool:
        """``/flush_cache``: empty the prefix cache, only when idle (else False)."""
        if not self.idle():
            self.log.warning(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {len(self.queue)}, #running-req: {len(self.running)}"
            )
            return False
        if self.cache is not None:
            self.cache.reset()
        self.log.info("Cache flushed successfully!", tp=True)
        return True

    def _log_prefill(self, new_seqs: int, new_tokens: int, cached: int, pending: int) -> None:
        """SGLang's per-batch line (scheduler_components/metrics_reporter.py
        report_prefill_stats) and the cache-hit gauge it updates."""
        total = new_tokens + cached
        self.cache_hit_rate = cached / total if total > 0 else 0.0
        if self.log.quiet:
            return
        now = time.perf_counter()
        gap = now - self._last_prefill_log
        self._last_prefill_log = now
        running = len(self.running) - (new_seqs if self.mode != "prefill" else 0)
        msg = (
            f"Prefill batch, #new-seq: {new_seqs}, #new-token: {new_tokens}, "
            f"#cached-token: {cached}, token usage: {self._token_usage():.2f}, "
            f"#running-req: {max(0, running)}, #queue-req: {len(self.queue)}, "
            f"#pending-token: {max(0, pending)}, "
        )
        if self.mode == "prefill":
            msg += "#bootstrap-req: 0, #inflight-req: 0, #optimistic-req: 0, "
        rate = new_tokens / gap if gap > 0 else 0.0
        self.log.info(msg + f"cuda graph: False, input throughput (token/s): {rate:.2f}", tp=True)

    # ---- loop ----
    async def run(self) -> None:
        if self.mode == "prefill":
            await self._run_prefill()
        else:
            await self._run_decode()

    def _step_noise(self) -> float:
        return self.noise * (1.0 + self.rng.uniform(-self.jitter, self.jitter))

    async def _sleep_until(self, deadline: float) -> None:
        delay = deadline - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _run_prefill(self) -> None:
        """FIFO, one request per forward, ``chunked_prefill_size`` tokens at most."""
        loop = asyncio.get_running_loop()
        while True:
            while self.queue and self.queue[0].done.done():
                gone = self.queue.popleft()
                self.queued_tokens -= gone.n_prompt
                self._release(gone)
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
                continue
            req = self.queue[0]
            cached = 0
            if not req.matched:  # its first chunk: only the uncached suffix is computed
                cached = self._match(req)
                req.prefilled = cached
            tokens = min(self.chunk, req.n_prompt - req.prefilled)
            self._log_prefill(1, tokens, cached, self.queued_tokens - req.prefilled - tokens)
            start = loop.time()
            await self._sleep_until(
                start + pm.prefill_forward_seconds(self.cfg, tokens) * self._step_noise()
            )
            req.prefilled += tokens
            if req.prefilled >= req.n_prompt:
                self.queue.popleft()
                self.queued_tokens -= req.n_prompt
                self._cache_prompt(req)  # the KV goes to the decode; its pages stay cached
                self._release(req)
                if self.drafts:  # the MTP layer over the prompt and one draft step
                    await self._sleep_until(
                        loop.time()
                        + pm.prefill_draft_seconds(self.cfg, req.n_prompt) * self._step_noise()
                    )
                await self._emit([req], prefill_only=True)

    async def _run_decode(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while True:
            if not self.running and not self.queue:
                self.wake.clear()
                await self.wake.wait()
                next_t = loop.time()
            admitted: list[Req] = []
            while self.queue and len(self.running) < self.cap:
                req = self.queue.popleft()
                self.queued_tokens -= req.n_prompt
                if req.done.done():
                    continue
                self.running.append(req)
                admitted.append(req)
            if self.mode == "null" and admitted:
                tokens = sum(r.n_prompt for r in admitted)
                cached = 0
                if self.cache is not None:  # one batch, the summed uncached suffixes
                    for r in admitted:
                        if r.pages:
                            cached += self._match(r)
                    tokens -= cached
                self._log_prefill(len(admitted), tokens, cached, self.queued_tokens)
                start = max(next_t, loop.time())
                next_t = start + pm.prefill_seconds(self.cfg, tokens) * self._step_noise()
                await self._sleep_until(next_t)
                if self.cache is not None:
                    for r in admitted:
                        if r.pages:
                            self._cache_prompt(r)
                await self._emit(admitted, prefill_only=True)
                self._retire()
                if not self.running:
                    continue
            batch = len(self.running)
            now = loop.time()
            dt = pm.decode_step_seconds(self.cfg, batch) * self._step_noise()
            # The next step's device time runs while this process writes the last step's
            # chunks (SGLang's overlap scheduler): a step lasts max(dt, write time), so at
            # extreme speed-ups the writing, not an extra dt, is what limits.
            start = max(next_t, now - dt)
            next_t = start + dt
            await self._sleep_until(next_t)
            self.steps += 1
            await self._emit(list(self.running), prefill_only=False, step=dt)
            self._retire()
            if self.steps % DECODE_LOG_INTERVAL == 0:
                self._log_decode(batch, dt)

    def _log_decode(self, batch: int, dt: float) -> None:
        acc = self.accept_tokens / self.accept_slots if self.accept_slots else 1.0
        tokens = sum(r.n_prompt + r.generated for r in self.running)
        self.log.info(
            f"Decode batch. #running-req: {batch}, #token: {tokens}, token usage: "
            f"{self._token_usage():.2f}, accept len: {acc:.2f}, cuda graph: "
            f"{pm.uses_cuda_graph(self.cfg, batch)}, gen throughput (token/s): "
            f"{self.gen_throughput():.2f}, #queue-req: {len(self.queue)}, ",
            tp=True,
        )

    def _draw_tokens(self, req: Req) -> int:
        accept = (
            self.accept
            if req.seeded is None
            else self.accept_seeded
            if req.seeded
            else self.accept_unseeded
        )
        n = 1
        for a in accept:
            if self.rng.random() >= a:
                break
            n += 1
        return n

    async def _emit(self, reqs: list[Req], *, prefill_only: bool, step: float = 0.0) -> None:
        """Give each request its tokens of this step and write them (one chunk each)."""
        now = time.monotonic()
        emitted = 0
        emitted_plain = 0  # of which for non-streaming requests
        cfg_wrong = self.wrong
        for req in reqs:
            if req.done.done():
                continue
            left = req.max_tokens - req.generated
            n = 1 if prefill_only else self._draw_tokens(req)
            if not prefill_only and self.accept:
                self.accept_tokens += n
                self.accept_slots += 1
            n = min(n, left)
            start = req.generated
            piece_parts = []
            for p in range(start, start + n):
                piece_parts.append(text.token(req.key, p, wrong=cfg_wrong))
                req.generated += 1
                if not req.ignore_eos and text.is_eos(req.key, p, wrong=cfg_wrong):
                    req.finish = "stop"
                    break
            piece = "".join(piece_parts)
            req.parts.append(piece)
            emitted += req.generated - start
            if not req.stream:
                emitted_plain += req.generated - start
            if req.generated - start > 0:
                if req.t_first == 0.0:
                    req.t_first = now
                    self.ttft.observe(now - req.t_arrive, 1, "true" if req.stream else "false")
                req.t_last = now
            finished = (
                req.generated >= req.max_tokens
                or req.finish is not None
                or (prefill_only and self.mode == "prefill")
            )
            if piece and self.stream_interval > 1 and req.stream:
                piece = req.unsent + piece
                first = req.sent_at == 0
                if not (finished or first or req.generated - req.sent_at >= self.stream_interval):
                    req.unsent = piece
                    continue
                req.unsent = ""
                req.sent_at = req.generated
            if req.stream and piece:
                tr = req.transport
                if tr is not None:
                    if tr.is_closing() or tr.get_write_buffer_size() > WRITE_BUFFER_LIMIT:
                        req.finish = "abort"  # client gone or not reading
                        req.done.set_result(None)
                        continue
                    data = req.chunk(piece)
                    # one HTTP/1.1 chunk straight to the socket: no coroutine per write
                    tr.write(b"%x\r\n%b\r\n" % (len(data), data))
                elif req.resp is not None:  # HTTP/1.0: let aiohttp frame it
                    try:
                        await req.resp.write(req.chunk(piece))
                    except (ConnectionError, RuntimeError):
                        req.finish = "abort"
                        req.done.set_result(None)
                        continue
            if finished:
                req.done.set_result(None)
        if step > 0 and reqs:
            self.itl.observe(step, len(reqs))
        self.generation_tokens_total += emitted
        gen = self.generation_tokens
        if emitted > emitted_plain:
            gen["true"] = gen.get("true", 0) + emitted - emitted_plain
        if emitted_plain:
            gen["false"] = gen.get("false", 0) + emitted_plain
        self._tp_window.append((now, emitted))
        while self._tp_window and now - self._tp_window[0][0] > 5.0:
            self._tp_window.popleft()

    # ---- metrics ----
    def gen_throughput(self) -> float:
        if len(self._tp_window) < 2:
            return 0.0
        span = self._tp_window[-1][0] - self._tp_window[0][0]
        total = sum(n for _, n in list(self._tp_window)[1:])
        return total / span if span > 0 else 0.0

    def _token_usage(self) -> float:
        capacity = max(1, pm.kv_slots(self.cfg)) * SLOT_TOKENS
        return sum(r.n_prompt + r.generated for r in self.running) / capacity

    def metrics_text(self) -> str:
        acc = self.accept_tokens / self.accept_slots if self.accept_slots else 1.0
        return render_metrics(
            scheduler=self._scheduler_labels,
            tokenizer=self._tokenizer_labels,
            gauges={
                "sglang:num_running_reqs": ("The number of running requests.", len(self.running)),
                "sglang:num_queue_reqs": (
                    "The number of requests in the waiting queue.",
                    len(self.queue),
                ),
                "sglang:token_usage": ("The token usage.", round(self._token_usage(), 6)),
                "sglang:gen_throughput": (
                    "The generation throughput (token/s).",
                    round(self.gen_throughput(), 3),
                ),
                "sglang:spec_accept_length": (
                    "Mean acceptance length of speculative decoding (accepted drafts + bonus "
                    "token per forward).",
                    round(acc, 4),
                ),
                "sglang:cache_hit_rate": ("The prefix cache hit rate.", self.cache_hit_rate),
            },
            counters={
                "sglang:prompt_tokens_total": (
                    "Number of prefill tokens processed.",
                    self.prompt_tokens,
                ),
                "sglang:generation_tokens_total": (
                    "Number of generation tokens processed.",
                    self.generation_tokens,
                ),
                "sglang:num_requests_total": ("Number of requests processed.", self.num_requests),
                "sglang:cached_tokens_total": (
                    "Number of cached prompt tokens by source (device/host/storage).",
                    self.cached_tokens,
                ),
            },
            histograms=(self.ttft, self.itl, self.e2e),
            counter_labels={"sglang:cached_tokens_total": "cache_source"},
        )
