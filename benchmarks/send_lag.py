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

Where a stall comes from: ``--pin`` gives the server the last CPU and the client the others
(what is left is the client's own callbacks), ``--server-nice N`` runs the server at a lower
priority, ``--own-session`` starts it in a session of its own (a scheduling group apart from
the client where the kernel's autogroup is on, as the local launcher's services were); each
row also counts the sends over 1 ms and the times the client was preempted.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from autotune.loadgen import LoadSpec, run_load
from autotune.loadgen import client as loadgen_client
from autotune.ports import pick_free_port as _free_port

DEFAULT_SPIN = loadgen_client._OpenLoop.SPIN_S


def start_server(
    log: Path, *, cpus: set[int] | None = None, nice: int = 0, own_session: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
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
    proc = subprocess.Popen(
        argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=own_session
    )
    if cpus is not None:
        os.sched_setaffinity(proc.pid, cpus)
    if nice:
        os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, log, timeout_s=60, poll_s=0.1)
    return proc, url


def wait_healthy(
    proc: subprocess.Popen[bytes], url: str, log: Path, *, timeout_s: float, poll_s: float,
    what: str = "server",
) -> None:  # fmt: skip
    """Until ``url/health`` answers 200; exits with the log's tail if the process ends."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise SystemExit(f"{what} did not become healthy in {timeout_s:g} s")


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
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = run_load(url, spec)
    after = resource.getrusage(resource.RUSAGE_SELF)
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
        "late": int((lags > 1.0).sum()),
        "preempted": after.ru_nivcsw - before.ru_nivcsw,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="8,16,32,64,128")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--modes", default=",".join(MODES), help="which dispatchers, comma-separated")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="the server on the last CPU, this client on the others (is a stall the OS running "
        "the server in the client's place, or the client's own callbacks?)",
    )
    ap.add_argument(
        "--server-nice", type=int, default=0, help="the server's nice value (the client's is 0)"
    )
    ap.add_argument(
        "--own-session",
        action="store_true",
        help="start the server in a session of its own (setsid), as the local launcher did "
        "before: with the kernel's autogroup scheduling, a scheduling group apart from the client",
    )
    args = ap.parse_args()
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"--modes: unknown {sorted(unknown)}; choose from {list(MODES)}")
    server_cpus = None
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            ap.error("--pin needs two CPUs")
        server_cpus = {cpus[-1]}
        os.sched_setaffinity(0, set(cpus[:-1]))
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(
            Path(tmp) / "server.log",
            cpus=server_cpus,
            nice=args.server_nice,
            own_session=args.own_session,
        )
        try:
            rows = []
            for rate in rates:
                for mode in modes:
                    rows.append(one(url, rate, args.seconds, mode))
                    r = rows[-1]
                    print(
                        f"rate {rate:g} {mode}: sent {r['sent']}, lag p50 "
                        f"{r['lag_p50']:.3f} p99 {r['lag_p99']:.3f} p99.9 {r['lag_p999']:.3f} ms, "
                        f"cpu {r['cpu']:.0%}, {r['chunks_s']:,.0f} tok/s, bound: {r['bound']}, "
                        f"{r['late']} sends over 1 ms, {r['preempted']} preemptions",
                        flush=True,
                    )
        finally:
            proc.terminate()
            proc.wait(10)
    print()
    print("| rate (req/s) | dispatcher | requests | send lag p50 | p99 | p99.9 (ms) "
          "| client loop busy | output tok/s | client-bound | sends > 1 ms "
          "| client preempted |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['rate']:g} | {r['mode']} | {r['sent']} | {r['lag_p50']:.3f} "
            f"| {r['lag_p99']:.3f} "
            f"| {r['lag_p999']:.3f} | {r['cpu']:.0%} | {r['chunks_s']:,.0f} "
            f"| {'yes' if r['bound'] else 'no'} | {r['late']} | {r['preempted']} |"
        )


if __name__ == "__main__":
    main()
