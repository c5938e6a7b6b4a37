"""A simulated SGLang server: real HTTP, SGLang's endpoints, speed from the perf model.

One process is one server: ``--disaggregation-mode prefill`` runs prefill forwards,
``decode`` runs decode steps, ``null`` does both (prefill stalls decode, as without mixed
chunking). Decode is one asyncio loop: each step serves up to ``running_cap`` requests,
sleeps ``decode_step_seconds`` (times this process's noise) and writes every running
request's tokens of that step; there are no per-token sleeps and no per-request tasks.

Why one module of ~1,400 lines: it is one server process (the twin of one SGLang server), whose
endpoints, engine loop and PD hand-over share the process state; it is read against SGLang's
own server, section by section, and split it would hide which state a handler touches.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import os
import random
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import aiohttp
from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import BadHttpMessage

from autotune.sim import perf_model as pm
from autotune.sim import text
from autotune.sim.args import SimConfig, build_parser, parse_config
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
CHAT_DEFAULT_MAX_TOKENS = 128
COMPLETION_DEFAULT_MAX_TOKENS = 16
WRITE_BUFFER_LIMIT = 4 * 2**20  # a stream whose client stops reading is aborted


_JSON_STRINGS: dict[str, bytes] = {}


def _json_str(text: str) -> bytes:
    """``json.dumps(text)`` as bytes, memoised: chunks repeat the same few token strings."""
    out = _JSON_STRINGS.get(text)
    if out is None:
        out = json.dumps(text).encode()
        if len(_JSON_STRINGS) < 65536:
            _JSON_STRINGS[text] = out
    return out


def _now() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S")


class Log:
    """SGLang-like log lines on stdout (info) and stderr (errors), flushed at once."""

    def __init__(self, cfg: SimConfig) -> None:
        self.quiet = cfg.log_level in ("warning", "error", "critical")

    def info(self, msg: str, *, tp: bool = False) -> None:
        if not self.quiet:
            sys.stdout.write(f"[{_now()}{' TP0' if tp else ''}] {msg}\n")
            sys.stdout.flush()

    def warning(self, msg: str) -> None:
        if not self.quiet:
            sys.stdout.write(f"[{_now()}] WARNING: {msg}\n")
            sys.stdout.flush()

    def error_lines(self, lines: Sequence[str]) -> None:
        sys.stderr.write(
            "".join(f"[{_now()} TP0] {ln}\n" if i == 0 else f"{ln}\n" for i, ln in enumerate(lines))
        )
        sys.stderr.flush()


class Req:
    """One generation request, from arrival to its last written chunk."""

    __slots__ = (
        "seeded",
        "rid",
        "kind",
        "key",
        "n_prompt",
        "max_tokens",
        "ignore_eos",
        "stream",
        "include_usage",
        "resp",
        "done",
        "generated",
        "parts",
        "t_arrive",
        "t_first",
        "t_last",
        "prefix",
        "suffix",
        "finish",
        "prefilled",
        "model",
        "created",
        "transport",
        "unsent",
        "sent_at",
        "pages",
        "held",
        "cached",
        "matched",
        "report_cache",
    )

    def __init__(
        self,
        *,
        kind: str,
        prompt: str | list[int],
        max_tokens: int,
        ignore_eos: bool,
        stream: bool,
        include_usage: bool,
        model: str,
        cache: PrefixCache | None = None,
        report_cache: bool = False,
    ) -> None:
        self.rid = uuid.uuid4().hex
        self.seeded: bool | None = None
        """Decode: whether the prefill handed over draft state (ran EAGLE too); None: this
        server prefilled the request itself."""
        self.kind = kind
        self.key = text.prompt_key(prompt)
        self.pages: list[int] = []
        """Chain keys of the prompt's whole pages (with the radix cache on)."""
        if cache is not None:
            units = text.prompt_units(prompt)
            self.n_prompt = max(1, len(units))
            self.pages = cache.page_keys(units)
        else:
            self.n_prompt = text.prompt_tokens(prompt)
        self.held = 0  # pages of the prefix cache this request holds locked
        self.cached = 0  # prompt tokens served from the prefix cache (usage's cached_tokens)
        self.matched = False  # looked up in the prefix cache (at its first prefill chunk)
        self.report_cache = report_cache  # --enable-cache-report
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.stream = stream
        self.include_usage = include_usage
        self.resp: web.StreamResponse | None = None
        self.transport: asyncio.Transport | None = None
        self.unsent = ""  # text generated but not yet streamed (--stream-interval > 1)
        self.sent_at = 0  # tokens generated when the last chunk was streamed
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.generated = 0
        self.parts: list[str] = []
        self.t_arrive = time.monotonic()
        self.t_first = 0.0
        self.t_last = 0.0
        self.finish: str | None = None
        self.prefilled = 0
        self.model = model
        self.created = int(time.time())
        self.prefix, self.suffix = self._templates()

    def _templates(self) -> tuple[bytes, bytes]:
        head = {"id": self.rid, "created": self.created, "model": self.model}
        if self.kind == "chat":
            head["object"] = "chat.completion.chunk"
            pre = json.dumps(head)[:-1] + ', "choices": [{"index": 0, "delta": {"content": '
            suf = '}, "logprobs": null, "finish_reason": null}]}\n\n'
        elif self.kind == "completion":
            head["object"] = "text_completion"
            pre = json.dumps(head)[:-1] + ', "choices": [{"index": 0, "text": '
            suf = ', "logprobs": null, "finish_reason": null}]}\n\n'
        else:  # /generate streams cumulative text
            pre = '{"text": '
            suf = "}\n\n"
        return b"data: " + pre.encode(), suf.encode()

    def usage(self) -> dict[str, Any]:
        """OpenAI usage; ``prompt_tokens_details.cached_tokens`` only with
        ``--enable-cache-report`` (SGLang's UsageProcessor)."""
        out: dict[str, Any] = {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.generated,
            "total_tokens": self.n_prompt + self.generated,
        }
        if self.report_cache:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return out

    def meta_usage(self) -> dict[str, int]:
        """``/generate``'s meta_info counts: SGLang always sends ``cached_tokens`` there."""
        return {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.generated,
            "total_tokens": self.n_prompt + self.generated,
            "cached_tokens": self.cached,
        }

    def chunk(self, piece: str) -> bytes:
        if self.kind == "generate":
            return self.prefix + json.dumps("".join(self.parts)).encode() + self.suffix
        return self.prefix + _json_str(piece) + self.suffix

    def final_chunks(self) -> bytes:
        """Finish-reason chunk, usage chunk (if asked) and ``[DONE]``."""
        out: list[dict[str, Any]] = []
        finish = self.finish or "length"
        if self.kind == "generate":
            meta = {"id": self.rid, "finish_reason": {"type": finish}, **self.meta_usage()}
            out.append({"text": "".join(self.parts), "meta_info": meta})
        else:
            obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            if self.kind == "chat":
                choice["delta"] = {}
            else:
                choice["text"] = ""
            base: dict[str, Any] = {
                "id": self.rid,
                "object": obj,
                "created": self.created,
                "model": self.model,
            }
            out.append({**base, "choices": [choice]})
            if self.include_usage:
                out.append({**base, "choices": [], "usage": self.usage()})
        return (
            b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in out)
            + b"data: [DONE]\n\n"
        )

    def body(self) -> dict[str, Any]:
        """Non-streaming response body."""
        full = "".join(self.parts)
        finish = self.finish or "length"
        if self.kind == "generate":
            return {
                "text": full,
                "meta_info": {
                    "id": self.rid,
                    "finish_reason": {"type": finish, "length": self.generated},
                    **self.meta_usage(),
                    "e2e_latency": self.t_last - self.t_arrive,
                },
            }
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": full,
                    "reasoning_content": None,
                    "tool_calls": None,
                },
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": full,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            obj = "text_completion"
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }


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


# ----------------------------------------------------------------------------------------
# PD disaggregation: the KV hand-over from prefill to decode
# ----------------------------------------------------------------------------------------
# The router sends one request to prefill and decode at the same time, with the same
# bootstrap_host/bootstrap_port (the prefill's --disaggregation-bootstrap-port) and
# bootstrap_room. The prefill runs its forward and marks the room's KV ready in its
# bootstrap server; the decode long-polls that server for the room (one HTTP request per
# request, kept-alive connections, no polling loop), then decodes. A prefill that is gone
# refuses the connection (the decode fails the request at once); one that never serves the
# room makes the decode give up after SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds, and a
# ready room nobody fetches is dropped after SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # srt/disaggregation/utils.py: warm-up/health, no transfer
KV_POLL_S = 5.0  # one long poll at most this long; then ask again (bounded in all)
KV_CONNECT_S = 3.0


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


class _Room:
    __slots__ = ("created", "expire", "fut")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.created = time.monotonic()
        self.expire: asyncio.TimerHandle | None = None


class KVRooms:
    """The prefill's bootstrap registry: room -> its KV (ready, failed or still coming)."""

    def __init__(self, expire_s: float) -> None:
        self.expire_s = expire_s
        self.rooms: dict[int, _Room] = {}

    def _get(self, room: int) -> _Room:
        entry = self.rooms.get(room)
        if entry is None:
            loop = asyncio.get_running_loop()
            entry = self.rooms[room] = _Room(loop)
            entry.expire = loop.call_later(self.expire_s, self._expire, room, entry)
        return entry

    def _expire(self, room: int, entry: _Room) -> None:
        if self.rooms.get(room) is entry:
            del self.rooms[room]
        if not entry.fut.done():
            elapsed = time.monotonic() - entry.created
            entry.fut.set_result(
                {"error": f"Request {room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"}
            )

    def expect(self, room: int) -> None:
        self._get(room)

    def ready(self, room: int, info: dict[str, Any]) -> None:
        fut = self._get(room).fut
        if not fut.done():
            fut.set_result(info)

    def fail(self, room: int, reason: str) -> None:
        fut = self._get(room).fut
        if not fut.done():
            fut.set_result({"error": reason})

    async def wait(self, room: int, timeout_s: float) -> dict[str, Any] | None:
        """The room's outcome ({"error": ...} when it failed), or None after ``timeout_s``."""
        entry = self._get(room)
        try:
            out = await asyncio.wait_for(asyncio.shield(entry.fut), timeout_s)
        except TimeoutError:
            return None
        if self.rooms.get(room) is entry:  # handed over: nothing left to keep
            del self.rooms[room]
            if entry.expire is not None:
                entry.expire.cancel()
        return out


ROOMS_KEY = web.AppKey("rooms", KVRooms)


async def _bootstrap_health(request: web.Request) -> web.Response:
    return web.Response(text="OK")


async def _bootstrap_kv(request: web.Request) -> web.Response:
    """``GET /kv/{room}?wait=S``: 200 when the room's KV is ready, 410 when it failed,
    204 when it is still coming after S seconds (ask again)."""
    try:
        room = int(request.match_info["room"])
        wait = min(max(float(request.query.get("wait", KV_POLL_S)), 0.0), 60.0)
    except ValueError:
        return web.json_response({"error": "bad room or wait"}, status=400)
    out = await request.app[ROOMS_KEY].wait(room, wait)
    if out is None:
        return web.Response(status=204)
    return web.json_response(out, status=410 if "error" in out else 200)


def build_bootstrap_app(rooms: KVRooms) -> web.Application:
    """The prefill's bootstrap server (``--disaggregation-bootstrap-port``)."""
    app = web.Application()
    app[ROOMS_KEY] = rooms
    app.router.add_get("/health", _bootstrap_health)
    app.router.add_get("/kv/{room}", _bootstrap_kv)
    return app


class _KVTransferError(Exception):
    """The decode did not get its room's KV (the message is SGLang's abort message); the
    request handler turns it into that abort, so it never leaves this module."""


class KVReceiver:
    """The decode side: waits for the KV of one room from the prefill named in the request."""

    def __init__(self, waiting_timeout_s: float) -> None:
        self.waiting_timeout_s = waiting_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def receive(self, *, host: str, port: int, room: int, rid: str) -> dict[str, Any]:
        """The prefill's hand-over once the room's KV is here (what it sent along: whether
        it ran the speculative algorithm, so the drafts start seeded); raise
        :class:`_KVTransferError` otherwise."""
        who = f"rank=0 decode_req.req.rid={rid!r} decode_req.req.bootstrap_room={room}"
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.waiting_timeout_s
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise _KVTransferError(
                    f"Decode transfer failed for request {who} with exception Request {room} "
                    f"timed out after {loop.time() - start:.1f}s in KVPoll.WaitingForInput"
                )
            wait = min(KV_POLL_S, left)
            timeout = aiohttp.ClientTimeout(total=wait + KV_CONNECT_S, sock_connect=KV_CONNECT_S)
            try:
                async with self._client().get(
                    f"http://{addr}/kv/{room}", params={"wait": f"{wait:.3f}"}, timeout=timeout
                ) as resp:
                    status = resp.status
                    body = await resp.read()
            except asyncio.TimeoutError:
                continue  # a prefill that does not answer: ask again until the deadline
            except aiohttp.ClientError as exc:
                raise _KVTransferError(
                    f"Decode handshake failed for request {who} with exception cannot reach "
                    f"the bootstrap server http://{addr}: {exc}"
                ) from None
            if status == 200:
                try:
                    info = json.loads(body)
                except ValueError:
                    info = {}
                return info if isinstance(info, dict) else {}
            if status == 204:
                continue
            try:
                reason = str(json.loads(body).get("error", ""))
            except (ValueError, AttributeError):
                reason = body.decode("utf-8", "replace")[:200]
            raise _KVTransferError(
                f"Decode transfer failed for request {who} with exception {reason or status}"
            )


# ----------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------
class State:
    def __init__(self, cfg: SimConfig, log: Log, argv: Sequence[str] = ()) -> None:
        self.cfg = cfg
        self.log = log
        self.argv = list(argv)
        self.ready = False
        self.started = time.monotonic()
        self.startup_time = 0.0
        self.engine = Engine(cfg, log)
        self.pd = cfg.disaggregation_mode in ("prefill", "decode")
        self.fake_transfer = cfg.disaggregation_transfer_backend == "fake"
        self.rooms = KVRooms(_env_seconds("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0))
        self.receiver = KVReceiver(_env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0))


STATE_KEY = web.AppKey("state", State)


def _error(status: int, message: str) -> web.Response:
    kind = "BadRequestError" if status == 400 else "ServiceUnavailableError"
    return web.json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status},
        status=status,
    )


def _state(request: web.Request) -> State:
    return request.app[STATE_KEY]


async def health(request: web.Request) -> web.Response:
    if not _state(request).ready:
        return web.Response(status=503, text="")
    return web.Response(status=200, text="")


async def models(request: web.Request) -> web.Response:
    st = _state(request)
    name = st.engine.model_name
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "sglang",
                    "root": st.cfg.model_path,
                    "max_model_len": pm.resolve(st.cfg)["context_length"],
                }
            ],
        }
    )


def _cuda_graph_bs(info: dict[str, Any], cfg: SimConfig) -> list[int]:
    """Decode CUDA-graph batch sizes captured (SGLang's list: 1, 2, 4, then steps of 8)."""
    if cfg.disaggregation_mode == "prefill" or not pm.uses_cuda_graph(cfg, 1):
        return []
    sizes = info.get("cuda_graph_bs_decode")  # the resolved list (perf_model.resolve)
    if isinstance(sizes, list) and sizes:
        return [int(b) for b in sizes]
    top = info.get("cuda_graph_max_bs_decode", info.get("cuda_graph_max_bs"))
    if not isinstance(top, int) or isinstance(top, bool) or top <= 0:
        return []
    return [b for b in (1, 2, 4) if b <= top] + list(range(8, top + 1, 8))


def _server_info(st: State) -> dict[str, Any]:
    """``GET /server_info`` of SGLang 0.5.23: the resolved ServerArgs fields, the launch
    command, the scheduler's start-up info, ``internal_states`` (one per DP rank: the
    resolved fields again plus live scheduler state), ``version`` and ``frontend``."""
    cfg, eng = st.cfg, st.engine
    resolved = dict(pm.resolve(cfg))
    slots = pm.kv_slots(cfg)
    total_tokens = max(1, slots) * SLOT_TOKENS
    context = resolved.get("context_length")
    max_input = min(
        (int(context) if isinstance(context, int) else total_tokens) - 1, total_tokens - 1
    )
    weights_gb = pm._weights_bytes_per_gpu(cfg, pm.checkpoint_of(cfg)) / 2**30
    state: dict[str, Any] = {
        **resolved,
        "world_size": cfg.tp_size,
        "startup_time": st.startup_time,
        "effective_max_running_requests_per_dp": max(1, pm.running_cap(cfg)),
        "last_gen_throughput": round(eng.gen_throughput(), 3),
        "memory_usage": {
            "weight": round(weights_gb, 3),
            "kvcache": round(pm.kv_pool_bytes(cfg) / 2**30, 3),
            "startup_available": round(pm.GPU_MEM_BYTES / 2**30 - 0.6, 3),
            "token_capacity": total_tokens,
            "token_capacity_swa": None,
            "graph": {},
        },
        "disaggregation_mode": cfg.disaggregation_mode,
        "decode_cuda_graph_bs": _cuda_graph_bs(resolved, cfg),
        "decode_cuda_graph_memory_gb": 0.0,
    }
    if cfg.speculative_algorithm and eng.accept_slots:
        state["avg_spec_accept_length"] = eng.accept_tokens / eng.accept_slots
    return {
        **resolved,
        "launch_command": shlex.join(st.argv),
        "status": "ready",
        "max_total_num_tokens": total_tokens,
        "max_req_input_len": max_input,
        "startup_time": st.startup_time,
        "hicache_object_layout": None,
        "kv_events": None,
        "internal_states": [state],
        "version": pm.SGLANG_VERSION,
        "frontend": "python",
    }


async def server_info(request: web.Request) -> web.Response:
    return web.json_response(_server_info(_state(request)))


async def model_info(request: web.Request) -> web.Response:
    """``GET /model_info`` (the router reads it when it registers a worker)."""
    st = _state(request)
    return web.json_response(
        {
            "model_path": st.cfg.model_path,
            "served_model_name": st.engine.model_name,
            "tokenizer_path": st.cfg.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": st.cfg.disaggregation_mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "deepseek_v4",
            "architectures": ["DeepseekV4ForCausalLM"],
        }
    )


def _deprecated_alias(
    old: str, new: str, handler: Callable[[web.Request], Awaitable[web.Response]]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An old endpoint name that still answers, with SGLang's deprecation warning."""

    async def alias(request: web.Request) -> web.Response:
        _state(request).log.warning(
            f"Endpoint '{old}' is deprecated and will be removed in a future version. "
            f"Please use '{new}' instead."
        )
        return await handler(request)

    return alias


async def flush_cache(request: web.Request) -> web.Response:
    """``/flush_cache`` (GET or POST): empty the radix cache when idle; ``?timeout=S`` waits
    up to S seconds for idleness (scheduler_components/flush_wrapper.py), else HTTP 400."""
    st = _state(request)
    try:
        timeout = max(0.0, float(request.query.get("timeout", 0) or 0))
    except ValueError:
        return _error(400, "timeout must be a number")
    deadline = time.monotonic() + timeout
    while timeout > 0 and not st.engine.idle() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    if timeout > 0 and not st.engine.idle():
        return web.Response(status=400, text="Timed out waiting for idle state.")
    if not st.engine.flush():
        return web.Response(status=400, text="Flush cache failed.\n")
    return web.Response(
        text="Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation "
        "will not be performed.)\n"
    )


async def metrics(request: web.Request) -> web.Response:
    st = _state(request)
    if not st.cfg.enable_metrics:
        return web.Response(status=404, text="404: Not Found")
    return web.Response(text=st.engine.metrics_text(), content_type="text/plain", charset="utf-8")


def _as_int(value: Any, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer")
    return value


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    st = _state(request)
    if not st.ready:
        return _error(503, "The server is not ready yet.")
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("request body must be a JSON object")
        ignore_eos = bool(body.get("ignore_eos", False))
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage", False)) if isinstance(opts, dict) else False
        prompt: str | list[int]
        if kind == "chat":
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ValueError("messages must be a non-empty list")
            parts = []
            for m in msgs:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):
                    content = " ".join(
                        str(c.get("text", "")) for c in content if isinstance(c, dict)
                    )
                parts.append(
                    f"{m.get('role', 'user') if isinstance(m, dict) else 'user'}: {content or ''}"
                )
            prompt = "\n".join(parts)
            max_tokens = _as_int(
                body.get("max_completion_tokens", body.get("max_tokens")),
                "max_tokens",
                CHAT_DEFAULT_MAX_TOKENS,
            )
        elif kind == "completion":
            raw = body.get("prompt")
            if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
                raw = raw[0]
            if isinstance(raw, str):
                prompt = raw
            elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
                prompt = [int(t) for t in raw]
            else:
                raise ValueError("prompt must be a string or a list of token ids")
            max_tokens = _as_int(
                body.get("max_tokens"), "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS
            )
        else:
            sp = body.get("sampling_params") or {}
            ignore_eos = bool(sp.get("ignore_eos", False))
            raw = body.get("input_ids", body.get("text"))
            if isinstance(raw, str):
                prompt = raw
            elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
                prompt = [int(t) for t in raw]
            else:
                raise ValueError("text or input_ids is required")
            max_tokens = _as_int(
                sp.get("max_new_tokens"), "max_new_tokens", CHAT_DEFAULT_MAX_TOKENS
            )
    except (ValueError, json.JSONDecodeError, AttributeError, TypeError) as exc:
        return _error(400, str(exc))
    model = str(body.get("model") or st.engine.model_name)
    req = Req(
        kind=kind,
        prompt=prompt,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        model=model,
        cache=st.engine.cache,
        report_cache=st.cfg.enable_cache_report,
    )
    room = body.get("bootstrap_room")
    if st.pd:
        if room is None and not st.fake_transfer:
            # srt/managers/scheduler.py: a PD server refuses a request without a room
            message = (
                "Invalid request: Disaggregated request received without bootstrap room id. "
                f"req.rid={req.rid!r}"
            )
            st.log.error_lines([message])
            return await _abort(request, req, message, 400)
        if room is not None and (isinstance(room, bool) or not isinstance(room, int)):
            return _error(400, "bootstrap_room must be an integer")
    room_id = room if isinstance(room, int) and not isinstance(room, bool) else None
    transfer = (
        st.pd
        and room_id is not None
        and not st.fake_transfer
        and body.get("bootstrap_host") != FAKE_BOOTSTRAP_HOST
    )
    if st.cfg.disaggregation_mode == "prefill":
        return await _serve_prefill(request, st, req, room_id if transfer else None)
    if stream:
        await _prepare_stream(request, req)
    if transfer and room_id is not None and st.cfg.disaggregation_mode == "decode":
        host = body.get("bootstrap_host")
        port = body.get("bootstrap_port") or st.cfg.disaggregation_bootstrap_port
        try:
            if not isinstance(host, str) or not host or not isinstance(port, int):
                raise _KVTransferError(
                    f"Decode handshake failed for request rank=0 decode_req.req.rid={req.rid!r} "
                    f"decode_req.req.bootstrap_room={room} with exception no bootstrap "
                    f"address (bootstrap_host={host!r}, bootstrap_port={port!r})"
                )
            handoff = await st.receiver.receive(host=host, port=port, room=room_id, rid=req.rid)
            req.seeded = bool(handoff.get("draft_seeded", False))
            # disaggregation/decode.py: the prefill's cached-token count rides with the KV
            cached = handoff.get("cached_tokens", 0)
            req.cached = cached if isinstance(cached, int) and cached > 0 else 0
        except _KVTransferError as exc:
            st.log.error_lines([str(exc)])
            return await _abort(request, req, str(exc), 500)
    await _run_to_completion(st, req)
    st.engine.finished(req)
    if stream:
        assert req.resp is not None
        try:
            await req.resp.write(req.final_chunks())
            await req.resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return req.resp
    return web.json_response(req.body())


async def _prepare_stream(request: web.Request, req: Req) -> None:
    """Send the SSE headers; on HTTP/1.1 the engine then writes chunks to the socket."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    fast = request.version == HttpVersion11
    if fast:
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    req.resp = resp
    if fast:
        # headers must be on the wire before we write chunks to the socket ourselves
        writer = getattr(resp, "_payload_writer", None)
        send_headers = getattr(writer, "send_headers", None)
        if callable(send_headers):
            send_headers()
        req.transport = request.transport  # type: ignore[assignment]


async def _run_to_completion(st: State, req: Req) -> None:
    """Hand ``req`` to the engine and wait until it is done; a client that goes away
    (the handler is cancelled) aborts it and frees its slot."""
    if req.max_tokens == 0:
        req.done.set_result(None)
    else:
        st.engine.submit(req)
    try:
        await req.done
    except asyncio.CancelledError:
        req.finish = "abort"
        if not req.done.done():
            req.done.set_result(None)
        raise


async def _serve_prefill(
    request: web.Request, st: State, req: Req, room: int | None
) -> web.StreamResponse:
    """A prefill server's answer: the forward, then the room's KV is ready for the decode;
    the response (sent once the forward is done, like SGLang's) carries the first token
    and ``finish_reason: length``."""
    if room is not None:
        st.rooms.expect(room)
    delivered = False
    try:
        await _run_to_completion(st, req)
        if room is not None and req.finish != "abort":
            st.rooms.ready(
                room,
                {
                    "room": room,
                    "prompt_tokens": req.n_prompt,
                    "draft_seeded": st.engine.drafts,
                    "cached_tokens": req.cached,
                },
            )
            delivered = True
    finally:
        if room is not None and not delivered:
            st.rooms.fail(
                room,
                f"Prefill transfer failed for request rank=0 req.rid={req.rid!r} "
                f"req.bootstrap_room={room}: the request was aborted",
            )
    st.engine.finished(req)
    if not req.stream:
        return web.json_response(req.body())
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    text = "".join(req.parts)
    try:
        await resp.write((req.chunk(text) if text else b"") + req.final_chunks())
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def _abort(request: web.Request, req: Req, message: str, status: int) -> web.StreamResponse:
    """A request SGLang's scheduler aborts with an HTTP status (prepare_abort): a JSON error
    with that status, or, on a stream, HTTP 200 with an error event (then usage, [DONE])."""
    if not req.stream:
        if req.kind == "generate":
            key = "error" if status == 400 else "detail"
            payload: Any = {"message": message} if status == 400 else message
            return web.json_response({key: payload}, status=status)
        err_type = "BadRequestError" if status == 400 else str(status)
        return web.json_response(
            {"object": "error", "message": message, "type": err_type, "param": None,
             "code": status},
            status=status,
        )  # fmt: skip
    if req.resp is None:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        req.resp = resp
    name = "BAD_REQUEST" if status == 400 else "INTERNAL_SERVER_ERROR"
    events: list[Any] = []
    if req.kind == "generate":
        finish = {"type": "abort", "message": message, "status_code": status, "err_type": None}
        meta = {"id": req.rid, "finish_reason": finish, **req.meta_usage()}
        events.append({"text": "", "output_ids": [], "meta_info": meta})
    else:
        events.append(
            {"error": {"object": "error", "message": message, "type": name, "param": None,
                       "code": status}}
        )  # fmt: skip
        if req.include_usage:
            obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
            events.append(
                {"id": req.rid, "object": obj, "created": req.created, "model": req.model,
                 "choices": [], "usage": req.usage()}
            )  # fmt: skip
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    try:
        await req.resp.write(data + b"data: [DONE]\n\n")
        await req.resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return req.resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def generate(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "generate")


def build_app(state: State) -> web.Application:
    app = web.Application(client_max_size=64 * 2**20)
    app[STATE_KEY] = state
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/server_info", server_info)
    app.router.add_get(
        "/get_server_info", _deprecated_alias("/get_server_info", "/server_info", server_info)
    )
    app.router.add_get("/model_info", model_info)
    app.router.add_get(
        "/get_model_info", _deprecated_alias("/get_model_info", "/model_info", model_info)
    )
    app.router.add_post("/flush_cache", flush_cache)
    app.router.add_get("/flush_cache", flush_cache)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/generate", generate)
    return app


def _log_startup(cfg: SimConfig, log: Log) -> None:
    args = ", ".join(f"{k}={v!r}" for k, v in pm.resolve(cfg).items())
    log.info(f"server_args=ServerArgs({args})")
    for rewrite in pm.silent_rewrites(cfg):
        log.warning(rewrite)
    if pm.allreduce_path(cfg) == "pcie_ipc":
        log.info(
            "Using FlashInfer PCIe IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1)", tp=True
        )
    log.info(f"Init torch distributed begin. tp_size={cfg.tp_size}", tp=True)
    log.info(f"Load weight begin. avail mem={pm.GPU_MEM_BYTES / 2**30 - 0.6:.2f} GB", tp=True)


class _QuietProbes(logging.Filter):
    """Drop aiohttp's traceback for the router's HTTP/2 probe (it tries gRPC first: the
    request line ``PRI * HTTP/2.0`` is answered 400, which is what the router expects)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, BadHttpMessage) and "PRI" in str(exc))


def _bind_error(log: Log, exc: OSError, host: str, port: int) -> None:
    log.error_lines(
        [
            f"ERROR: [Errno {exc.errno}] error while attempting to bind on "
            f"address ('{host}', {port}): address already in use"
        ]
    )


async def serve(
    cfg: SimConfig, log: Log, *, stream_interval: int = 1, argv: Sequence[str] = ()
) -> int:
    """Listen at once (503 while 'loading'), then fail or become ready; run until SIGTERM.

    A prefill server (``--disaggregation-mode prefill``) also runs its bootstrap server on
    ``--disaggregation-bootstrap-port`` (same host), where decode servers fetch the KV."""
    logging.getLogger("aiohttp.server").addFilter(_QuietProbes())
    state = State(cfg, log, argv)
    state.engine.stream_interval = stream_interval
    # Stop within a second when told (like SGLang): open streams are cut, not awaited.
    runner = web.AppRunner(
        build_app(state),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
        handler_cancellation=True,  # a client that gave up frees its engine slot
    )
    await runner.setup()
    runners = [runner]

    async def cleanup() -> None:
        await state.receiver.close()
        for r in reversed(runners):
            await r.cleanup()

    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        _bind_error(log, exc, cfg.host, cfg.port)
        await cleanup()
        return 1
    if cfg.disaggregation_mode == "prefill" and not state.fake_transfer:
        boot = web.AppRunner(
            build_bootstrap_app(state.rooms),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=1.0,
            handler_cancellation=True,
        )
        await boot.setup()
        runners.append(boot)
        port = cfg.disaggregation_bootstrap_port
        try:
            await web.TCPSite(boot, cfg.host, port, backlog=1024).start()
        except OSError as exc:
            _bind_error(log, exc, cfg.host, port)
            await cleanup()
            return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _log_startup(cfg, log)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=cfg.sim_load_seconds)
    if stop.is_set():
        await cleanup()
        return 0
    failure = pm.startup_failure(cfg)
    weights = pm._weights_bytes_per_gpu(cfg, pm.checkpoint_of(cfg)) / 2**30
    log.info(
        f"Load weight end. type=DeepseekV4ForCausalLM, dtype=torch.bfloat16, "
        f"avail mem={pm.GPU_MEM_BYTES / 2**30 - 0.6 - weights:.2f} GB, "
        f"mem usage={weights:.2f} GB.",
        tp=True,
    )
    if failure is not None:
        log.error_lines(failure.lines)
        await cleanup()
        return failure.exit_code
    slots = pm.kv_slots(cfg)
    log.info(
        f"KV Cache is allocated. #tokens: {slots * SLOT_TOKENS}, "
        f"KV size: {pm.kv_pool_bytes(cfg) / 2**30:.2f} GB",
        tp=True,
    )
    info = pm.resolve(cfg)
    if cfg.disaggregation_mode != "prefill" and pm.uses_cuda_graph(cfg, 1):
        log.info(
            f"Capture cuda graph begin. This can take up to several minutes. avail mem="
            f"{(1 - float(info['mem_fraction_static'])) * pm.GPU_MEM_BYTES / 2**30:.2f} GB",  # type: ignore[arg-type]
            tp=True,
        )
        log.info(
            f"Capture cuda graph end. Time elapsed: 0.01 s. bs={_cuda_graph_bs(dict(info), cfg)}",
            tp=True,
        )
    log.info(
        f"max_total_num_tokens={slots * SLOT_TOKENS}, chunked_prefill_size="
        f"{info['chunked_prefill_size']}, max_prefill_tokens=16384, "
        f"max_running_requests={info['max_running_requests']}, "
        f"context_len={info['context_length']}",
        tp=True,
    )
    engine_task = asyncio.create_task(state.engine.run())
    state.startup_time = time.monotonic() - state.started
    state.ready = True
    log.info(f"Uvicorn running on http://{cfg.host}:{cfg.port} (Press CTRL+C to quit)")
    log.info("The server is fired up and ready to roll!")
    await stop.wait()
    engine_task.cancel()
    await cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    cfg = parse_config(args, os.environ)
    log = Log(cfg)
    failure = pm.startup_failure(cfg)
    if failure is not None and not failure.after_load:
        log.error_lines(failure.lines)
        return failure.exit_code
    stream_interval = max(1, build_parser().parse_args(args).stream_interval)
    return asyncio.run(serve(cfg, log, stream_interval=stream_interval, argv=args))


if __name__ == "__main__":
    sys.exit(main())
