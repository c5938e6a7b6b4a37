"""A simulated SGLang server: real HTTP, SGLang's endpoints, speed from the perf model.

One process is one server: ``--disaggregation-mode prefill`` runs prefill forwards,
``decode`` runs decode steps, ``null`` does both (prefill stalls decode, as without mixed
chunking). Decode is one asyncio loop: each step serves up to ``running_cap`` requests,
sleeps ``decode_step_seconds`` (times this process's noise) and writes every running
request's tokens of that step; there are no per-token sleeps and no per-request tasks.

This module is the entry point (``python -m autotune.sim.server``): it assembles the app
and runs the start-up sequence (bind, load, fail or become ready, stop on SIGTERM). The
rest lives in private modules, each one concept, from the bottom up: ``_log`` (log
lines), ``_request`` (one request and its response encoding), ``_engine`` (scheduler and
model runner), ``_kv_transfer`` (the PD hand-over), ``_state`` (the process state every
handler reads), ``_info_routes`` and ``_generate_routes`` (the endpoints). Their public
names are re-exported here, so ``autotune.sim.server.X`` still works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from autotune.sim import perf_model as pm
from autotune.sim._engine import DECODE_LOG_INTERVAL, SLOT_TOKENS, WRITE_BUFFER_LIMIT, Engine
from autotune.sim._generate_routes import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    chat_completions,
    completions,
    generate,
)
from autotune.sim._info_routes import (
    _cuda_graph_bs,
    _deprecated_alias,
    flush_cache,
    health,
    metrics,
    model_info,
    models,
    server_info,
)
from autotune.sim._kv_transfer import (
    FAKE_BOOTSTRAP_HOST,
    KV_CONNECT_S,
    KV_POLL_S,
    ROOMS_KEY,
    KVReceiver,
    KVRooms,
    build_bootstrap_app,
)
from autotune.sim._log import Log
from autotune.sim._request import Req
from autotune.sim._state import STATE_KEY, State
from autotune.sim.args import SimConfig, build_parser, parse_config

__all__ = [
    "CHAT_DEFAULT_MAX_TOKENS",
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "DECODE_LOG_INTERVAL",
    "FAKE_BOOTSTRAP_HOST",
    "KV_CONNECT_S",
    "KV_POLL_S",
    "ROOMS_KEY",
    "SLOT_TOKENS",
    "STATE_KEY",
    "WRITE_BUFFER_LIMIT",
    "Engine",
    "KVReceiver",
    "KVRooms",
    "Log",
    "Req",
    "State",
    "build_app",
    "build_bootstrap_app",
    "chat_completions",
    "completions",
    "flush_cache",
    "generate",
    "health",
    "main",
    "metrics",
    "model_info",
    "models",
    "serve",
    "server_info",
]


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
