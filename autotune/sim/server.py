"""A simulated SGLang server: real HTTP, SGLang's endpoints, speed from the perf model.

One process is one server: ``--disaggregation-mode prefill`` runs prefill forwards,
``decode`` runs decode steps, ``null`` does both (prefill stalls decode, as without mixed
chunking). Decode is one asyncio loop: each step serves up to ``running_cap`` requests,
sleeps ``decode_step_seconds`` (times this process's noise) and writes every running
request's tokens of that step; there are no per-token sleeps and no per-request tasks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from aiohttp import HttpVersion11, web

from autotune.sim import perf_model as pm
from autotune.sim import text
from autotune.sim.args import SimConfig, build_parser, parse_config
from autotune.sim.metrics import ITL_BUCKETS, TTFT_BUCKETS, Histogram, render_metrics

DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
SLOT_TOKENS = 8192  # nominal tokens per KV slot, for sglang:token_usage
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
    ) -> None:
        self.rid = uuid.uuid4().hex
        self.kind = kind
        self.key = text.prompt_key(prompt)
        self.n_prompt = text.prompt_tokens(prompt)
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

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.generated,
            "total_tokens": self.n_prompt + self.generated,
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
            meta = {"id": self.rid, "finish_reason": {"type": finish}, **self.usage()}
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
                    **self.usage(),
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
        self.chunk = int(pm.resolve(cfg)["chunked_prefill_size"])  # type: ignore[call-overload]
        seed = cfg.sim_seed if cfg.sim_seed is not None else int.from_bytes(os.urandom(8), "big")
        self.rng = random.Random(seed)
        self.noise = math.exp(self.rng.gauss(0.0, cfg.sim_noise)) if cfg.sim_noise > 0 else 1.0
        self.jitter = min(0.01, cfg.sim_noise / 3)
        self.queue: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.wake = asyncio.Event()
        self.model_name = cfg.served_model_name or cfg.model_path
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.steps = 0
        self.accept_tokens = 0
        self.accept_slots = 0
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self._tp_window: collections.deque[tuple[float, int]] = collections.deque()
        self.stream_interval = 1
        """SGLang's ``--stream-interval``: stream a chunk every this many tokens (and the
        first and last ones); 1 (the default) streams every decode step."""

    # ---- intake ----
    def submit(self, req: Req) -> None:
        self.prompt_tokens_total += req.n_prompt
        self.queue.append(req)
        self.wake.set()

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
                self.queue.popleft()
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
                continue
            req = self.queue[0]
            tokens = min(self.chunk, req.n_prompt - req.prefilled)
            start = loop.time()
            await self._sleep_until(
                start + pm.prefill_forward_seconds(self.cfg, tokens) * self._step_noise()
            )
            req.prefilled += tokens
            if req.prefilled >= req.n_prompt:
                self.queue.popleft()
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
                if req.done.done():
                    continue
                self.running.append(req)
                admitted.append(req)
            if self.mode == "null" and admitted:
                tokens = sum(r.n_prompt for r in admitted)
                start = max(next_t, loop.time())
                next_t = start + pm.prefill_seconds(self.cfg, tokens) * self._step_noise()
                await self._sleep_until(next_t)
                await self._emit(admitted, prefill_only=True)
                self.running = [r for r in self.running if not r.done.done()]
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
            self.running = [r for r in self.running if not r.done.done()]
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

    def _draw_tokens(self) -> int:
        n = 1
        for a in self.accept:
            if self.rng.random() >= a:
                break
            n += 1
        return n

    async def _emit(self, reqs: list[Req], *, prefill_only: bool, step: float = 0.0) -> None:
        """Give each request its tokens of this step and write them (one chunk each)."""
        now = time.monotonic()
        emitted = 0
        cfg_wrong = self.wrong
        for req in reqs:
            if req.done.done():
                continue
            left = req.max_tokens - req.generated
            n = 1 if prefill_only else self._draw_tokens()
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
            if req.generated - start > 0:
                if req.t_first == 0.0:
                    req.t_first = now
                    self.ttft.observe(now - req.t_arrive)
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
            model_name=self.model_name,
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
                    "The average acceptance length of speculative decoding.",
                    round(acc, 4),
                ),
            },
            counters={
                "sglang:prompt_tokens_total": (
                    "Number of prefill tokens processed.",
                    self.prompt_tokens_total,
                ),
                "sglang:generation_tokens_total": (
                    "Number of generation tokens processed.",
                    self.generation_tokens_total,
                ),
            },
            histograms=(self.ttft, self.itl),
        )


# ----------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------
class State:
    def __init__(self, cfg: SimConfig, log: Log) -> None:
        self.cfg = cfg
        self.log = log
        self.ready = False
        self.engine = Engine(cfg, log)


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


async def server_info(request: web.Request) -> web.Response:
    st = _state(request)
    info = dict(pm.resolve(st.cfg))
    info["version"] = pm.SGLANG_VERSION
    eng = st.engine
    info["internal_states"] = [
        {
            "avg_spec_accept_length": eng.accept_tokens / eng.accept_slots
            if eng.accept_slots
            else None,
            "last_gen_throughput": eng.gen_throughput(),
            "effective_max_running_requests": eng.cap,
            "allreduce": pm.allreduce_path(st.cfg),
            "silent_rewrites": pm.silent_rewrites(st.cfg),
        }
    ]
    return web.json_response(info)


async def flush_cache(request: web.Request) -> web.Response:
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
    )
    if stream:
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
    if max_tokens == 0:
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
    if stream:
        assert req.resp is not None
        try:
            await req.resp.write(req.final_chunks())
            await req.resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return req.resp
    return web.json_response(req.body())


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
    app.router.add_get("/get_server_info", server_info)
    app.router.add_post("/flush_cache", flush_cache)
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


async def serve(cfg: SimConfig, log: Log, *, stream_interval: int = 1) -> int:
    """Listen at once (503 while 'loading'), then fail or become ready; run until SIGTERM."""
    state = State(cfg, log)
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
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        log.error_lines(
            [
                f"ERROR: [Errno {exc.errno}] error while attempting to bind on "
                f"address ('{cfg.host}', {cfg.port}): address already in use"
            ]
        )
        await runner.cleanup()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _log_startup(cfg, log)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=cfg.sim_load_seconds)
    if stop.is_set():
        await runner.cleanup()
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
        await runner.cleanup()
        return failure.exit_code
    slots = pm.kv_slots(cfg)
    log.info(
        f"KV Cache is allocated. #tokens: {slots * SLOT_TOKENS}, "
        f"KV size: {pm.kv_pool_bytes(cfg) / 2**30:.2f} GB",
        tp=True,
    )
    info = pm.resolve(cfg)
    if cfg.disaggregation_mode != "prefill" and not cfg.disable_cuda_graph:
        log.info(
            f"Capture cuda graph begin. This can take up to several minutes. avail mem="
            f"{(1 - float(info['mem_fraction_static'])) * pm.GPU_MEM_BYTES / 2**30:.2f} GB",  # type: ignore[arg-type]
            tp=True,
        )
        log.info(
            f"Capture cuda graph end. Time elapsed: 0.01 s. bs=[1..{info['cuda_graph_max_bs']}]",
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
    state.ready = True
    log.info(f"Uvicorn running on http://{cfg.host}:{cfg.port} (Press CTRL+C to quit)")
    log.info("The server is fired up and ready to roll!")
    await stop.wait()
    engine_task.cancel()
    await runner.cleanup()
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
    return asyncio.run(serve(cfg, log, stream_interval=stream_interval))


if __name__ == "__main__":
    sys.exit(main())
