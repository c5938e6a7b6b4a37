"""Does the open loop keep its schedule on this machine? Send lag at the rates we use.

Starts one simulated SGLang server (prefill and decode in one process, a fast
configuration) in its own process, then runs the load generator's open loop at each rate
(Poisson arrivals, 256-token prompts, 128 streamed output tokens) and reports the send lag
(actual send - scheduled time: p50, p99, p99.9, max), the client event loop's CPU share and
whether the load generator reported itself as the bottleneck. Each rate runs three times,
side by side: the dispatcher as shipped (the request prepared ``_OpenLoop.SPIN_S`` ahead and
written by whichever sees it due first, the dispatcher or a stream read: the pacer), the
dispatcher's spin alone (``_OpenLoop.PACE = False``: written only between two event-loop
iterations), and plain ``asyncio.sleep`` timers (no spin).

    .venv/bin/python benchmarks/send_lag.py --rates 8,16,32,64,128 --seconds 10
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from autotune.loadgen import LoadSpec, run_load
from autotune.loadgen import client as loadgen_client

DEFAULT_SPIN = loadgen_client._OpenLoop.SPIN_S


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {
        **os.environ,
        "AUTOTUNE_SIM_LOAD_SECONDS": "0.1",
        "AUTOTUNE_SIM_SPEEDUP": "8",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "true",
    }
    argv = [
        sys.executable, "-m", "autotune.sim.server",
        "--model-path", "/models/DeepSeek-V4-Flash-NVFP4",
        "--quantization", "modelopt_fp4", "--moe-runner-backend", "flashinfer_cutlass",
        "--tp-size", "4", "--triton-attention-num-kv-splits", "8",
        "--max-running-requests", "256",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    fh = log.open("wb")
    proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("server did not become healthy")


MODES = {"pacer": (None, True), "spin only": (None, False), "asyncio.sleep only": (0.0, False)}
"""Dispatcher -> (SPIN_S: None = the default, PACE)."""


def one(url: str, rate: float, seconds: float, mode: str) -> dict[str, float | str | None]:
    spin, pace = MODES[mode]
    loadgen_client._OpenLoop.SPIN_S = DEFAULT_SPIN if spin is None else spin
    loadgen_client._OpenLoop.PACE = pace
    spec = LoadSpec(
        request_rate=rate,
        requests=None,
        duration_s=seconds,
        max_duration_s=seconds + 60,
        input_len=256,
        output_len=128,
        warmup_requests=8,
        concurrency=8,
        request_timeout_s=60,
    )
    result = run_load(url, spec)
    m = result.metrics
    lags = np.array([r.send_lag_s for r in result.records if r.send_lag_s is not None]) * 1000
    p50, p99, p999 = np.percentile(lags, [50, 99, 99.9])
    return {
        "rate": rate,
        "mode": mode,
        "sent": m.completed + m.failed,
        "arrival_rate": m.arrival_rate,
        "lag_p50": float(p50),
        "lag_p99": float(p99),
        "lag_p999": float(p999),
        "cpu": m.client_cpu_share,
        "chunks_s": m.output_throughput,
        "bound": m.client_bound,
        "ttft_p50": m.ttft_ms.p50,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="8,16,32,64,128")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp) / "server.log")
        try:
            rows = []
            for rate in rates:
                for mode in MODES:
                    rows.append(one(url, rate, args.seconds, mode))
                    r = rows[-1]
                    print(
                        f"rate {rate:g} {mode}: sent {r['sent']}, lag p50 "
                        f"{r['lag_p50']:.3f} p99 {r['lag_p99']:.3f} p99.9 {r['lag_p999']:.3f} ms, "
                        f"cpu {r['cpu']:.0%}, {r['chunks_s']:,.0f} tok/s, bound: {r['bound']}",
                        flush=True,
                    )
        finally:
            proc.terminate()
            proc.wait(10)
    print()
    print("| rate (req/s) | dispatcher | requests | send lag p50 | p99 | p99.9 (ms) "
          "| client loop busy | output tok/s | client-bound |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['rate']:g} | {r['mode']} | {r['sent']} | {r['lag_p50']:.3f} "
            f"| {r['lag_p99']:.3f} "
            f"| {r['lag_p999']:.3f} | {r['cpu']:.0%} | {r['chunks_s']:,.0f} "
            f"| {'yes' if r['bound'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
