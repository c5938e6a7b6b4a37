"""A PD router like ``sglang_router.launch_router --pd-disaggregation``.

Each generation request goes to a prefill worker first (non-streaming, ``max_tokens=1``:
the prefill's cost becomes part of TTFT), then to a decode worker whose response (SSE or
JSON) is passed back byte for byte. Workers are picked round-robin. A worker that fails
turns into HTTP 502 with a JSON error.

Every upstream call is time-limited (``--request-timeout-secs`` for generation, like
sglang-router's flag; ``--health-check-timeout-secs`` for health; at most 10 s for
``/v1/models``), and a client that disconnects cancels its handler, so a hung worker cannot
pin the router or its upstream connections forever.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import aiohttp
from aiohttp import web

_CONNECT_TIMEOUT_S = 10.0
_MODELS_TIMEOUT_S = 10.0
HOP_HEADERS = {
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "date",
    "server",
    "content-encoding",
}


@dataclass
class RouterConfig:
    prefill: list[tuple[str, int | None]]
    decode: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    health_timeout_s: float = 2.0
    request_timeout_s: float = 1800.0
    counters: dict[str, int] = field(default_factory=dict)


def _log(msg: str) -> None:
    sys.stdout.write(f"[{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}] {msg}\n")
    sys.stdout.flush()


def parse_args(argv: Sequence[str]) -> RouterConfig:
    """``--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL --host H --port P``."""
    p = argparse.ArgumentParser(prog="python -m autotune.sim.router", allow_abbrev=False)
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument(
        "--prefill", nargs="+", action="append", default=[], metavar="URL [BOOTSTRAP_PORT]"
    )
    p.add_argument("--decode", action="append", default=[], metavar="URL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--policy",
        default="round_robin",
        choices=("round_robin", "random", "cache_aware", "power_of_two"),
    )
    p.add_argument("--log-level", default="info")
    p.add_argument("--health-check-timeout-secs", type=float, default=2.0)
    p.add_argument("--request-timeout-secs", type=float, default=1800.0)
    ns = p.parse_args(list(argv))
    if not ns.pd_disaggregation:
        p.error("only --pd-disaggregation mode is simulated")
    if not ns.prefill or not ns.decode:
        p.error("--pd-disaggregation needs at least one --prefill and one --decode")
    prefill: list[tuple[str, int | None]] = []
    for item in ns.prefill:
        if len(item) > 2:
            p.error(f"--prefill takes URL [BOOTSTRAP_PORT], got {' '.join(item)}")
        port: int | None = None
        if len(item) == 2 and item[1].lower() != "none":
            try:
                port = int(item[1])
            except ValueError:
                p.error(f"invalid bootstrap port {item[1]!r}")
        prefill.append((item[0].rstrip("/"), port))
    return RouterConfig(
        prefill=prefill,
        decode=[u.rstrip("/") for u in ns.decode],
        host=ns.host,
        port=ns.port,
        health_timeout_s=ns.health_check_timeout_secs,
        request_timeout_s=ns.request_timeout_secs,
    )


class Router:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.rr_prefill = itertools.cycle(range(len(cfg.prefill)))
        self.rr_decode = itertools.cycle(range(len(cfg.decode)))
        self.session: aiohttp.ClientSession | None = None
        self.counters = {"requests": 0, "prefill_errors": 0, "decode_errors": 0, "completed": 0}

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(
                total=self.cfg.request_timeout_s, sock_connect=_CONNECT_TIMEOUT_S
            ),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def _session(self) -> aiohttp.ClientSession:
        assert self.session is not None
        return self.session

    async def health(self, request: web.Request) -> web.Response:
        urls = [u for u, _ in self.cfg.prefill] + list(self.cfg.decode)
        timeout = aiohttp.ClientTimeout(total=self.cfg.health_timeout_s)

        async def check(url: str) -> bool:
            try:
                async with self._session().get(url + "/health", timeout=timeout) as r:
                    return r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return False

        results = await asyncio.gather(*(check(u) for u in urls))
        down = [u for u, ok in zip(urls, results, strict=True) if not ok]
        if down:
            return web.json_response({"status": "unhealthy", "down": down}, status=503)
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        limit = min(_MODELS_TIMEOUT_S, self.cfg.request_timeout_s)
        timeout = aiohttp.ClientTimeout(total=limit, sock_connect=_CONNECT_TIMEOUT_S)
        try:
            async with self._session().get(self.cfg.decode[0] + "/v1/models", timeout=timeout) as r:
                return web.Response(
                    body=await r.read(), status=r.status, content_type="application/json"
                )
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return _bad_gateway(f"decode worker unreachable: {_why(exc)}")

    async def metrics(self, request: web.Request) -> web.Response:
        lines = []
        for name, value in self.counters.items():
            metric = f"sgl_router_{name}_total"
            lines += [f"# TYPE {metric} counter", f"{metric} {value}"]
        lines += [
            "# TYPE sgl_router_workers gauge",
            f'sgl_router_workers{{role="prefill"}} {len(self.cfg.prefill)}',
            f'sgl_router_workers{{role="decode"}} {len(self.cfg.decode)}',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.counters["requests"] += 1
        raw = await request.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
        except ValueError as exc:
            return web.json_response(
                {"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400},
                status=400,
            )
        prefill_url, bootstrap = self.cfg.prefill[next(self.rr_prefill)]
        decode_url = self.cfg.decode[next(self.rr_decode)]
        pre_body = dict(body, stream=False, max_tokens=1)
        pre_body.pop("stream_options", None)
        pre_body.pop("max_completion_tokens", None)
        if bootstrap is not None:
            pre_body["bootstrap_port"] = bootstrap
        try:
            async with self._session().post(prefill_url + request.path, json=pre_body) as r:
                await r.read()
                if r.status != 200:
                    self.counters["prefill_errors"] += 1
                    return _bad_gateway(f"prefill worker {prefill_url} answered {r.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.counters["prefill_errors"] += 1
            return _bad_gateway(f"prefill worker {prefill_url} failed: {_why(exc)}")
        try:
            upstream = await self._session().post(
                decode_url + request.path, data=raw, headers={"Content-Type": "application/json"}
            )
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.counters["decode_errors"] += 1
            return _bad_gateway(f"decode worker {decode_url} failed: {_why(exc)}")
        try:
            if upstream.status != 200 and upstream.status >= 500:
                self.counters["decode_errors"] += 1
                return _bad_gateway(f"decode worker {decode_url} answered {upstream.status}")
            headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
            resp = web.StreamResponse(status=upstream.status, headers=headers)
            await resp.prepare(request)
            try:
                async for data in upstream.content.iter_any():
                    await resp.write(data)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                self.counters["decode_errors"] += 1
                return resp  # headers already sent: the stream just ends
            except ConnectionError:
                return resp  # the client went away
            await resp.write_eof()
            self.counters["completed"] += 1
            return resp
        finally:
            upstream.release()


def _why(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError) and not str(exc):
        return "timed out"
    return str(exc) or type(exc).__name__


def _bad_gateway(message: str) -> web.Response:
    return web.json_response(
        {"object": "error", "message": message, "type": "BadGateway", "code": 502}, status=502
    )


async def serve(cfg: RouterConfig) -> int:
    router = Router(cfg)
    await router.start()
    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_get("/health", router.health)
    app.router.add_get("/health_generate", router.health)
    app.router.add_get("/v1/models", router.models)
    app.router.add_get("/metrics", router.metrics)
    app.router.add_post("/v1/completions", router.generate)
    app.router.add_post("/v1/chat/completions", router.generate)
    app.router.add_post("/generate", router.generate)
    # handler_cancellation: a client that gives up (the load generator's request timeout)
    # cancels the handler, which closes the upstream request instead of leaving it open.
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=1.0,  # stop within a second; open streams are cut, not awaited
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, cfg.host, cfg.port, backlog=1024).start()
    except OSError as exc:
        sys.stderr.write(
            f"ERROR: [Errno {exc.errno}] error while attempting to bind on "
            f"address ('{cfg.host}', {cfg.port}): address already in use\n"
        )
        await router.close()
        await runner.cleanup()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _log(
        f"PD router listening on http://{cfg.host}:{cfg.port}; prefill="
        f"{[u for u, _ in cfg.prefill]} decode={cfg.decode}"
    )
    await stop.wait()
    await router.close()
    await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(serve(cfg))


if __name__ == "__main__":
    sys.exit(main())
