"""Load-generator capacity and accuracy, side by side with a peer client (AIPerf).

Starts one simulated decode server (``autotune.sim.server``, the model's best NVFP4 decode
config with room for 512 running requests, run ``--speedup`` times faster than the modeled
hardware so the server's step time is not what limits), then, for each concurrency, runs
autotune's load generator and the peer against that same server, one after the other, with
the same request count and lengths. Each client runs as its own process; a sampler thread
reads the server's ``sglang:generation_tokens_total`` counter (``/metrics``) and the CPU
time of the client's and the server's process trees every 20 ms.

Per client: output tok/s by the client's own definition (tokens / first dispatch to last
completion); the server's count over that same window (counter delta, the server being
idle before and after); their ratio; the server's rate over its own active window (first
to last counter change); requests/s; TTFT and TPOT p50/p99 (AIPerf calls TPOT "inter token
latency"); client and server CPU (% of one core) over the window.

The peer is installed into a throwaway virtual environment (``--peer-venv``, default
``~/.cache/autotune-bench/aiperf``; reused when present, ``--fresh-peer`` rebuilds it) with
pip from the package registry. It needs a tokenizer but nothing may be downloaded at run
time, so a word-level tokenizer is built from AIPerf's own bundled corpus; token counts
come from the server's usage (``--use-server-token-count``) either way. Usage:

    .venv/bin/python benchmarks/loadgen_capacity.py --concurrency 16 64 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import venv
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks._procfs when run as a script

from autotune.ports import pick_free_port as free_port  # noqa: E402
from benchmarks._procfs import cpu_seconds, process_tree  # noqa: E402

MODEL = "deepseek-ai/DeepSeek-V4-Flash"
SERVER_FLAGS = [
    "--model-path", "/models/DeepSeek-V4-Flash-NVFP4", "--served-model-name", MODEL,
    "--tp-size", "4", "--disaggregation-mode", "decode", "--quantization", "modelopt_fp4",
    "--moe-runner-backend", "flashinfer_cutlass", "--mem-fraction-static", "0.9",
    "--cuda-graph-max-bs-decode", "256", "--max-running-requests", "512", "--enable-metrics",
    "--log-level", "warning",
    # a PD decode server the load goes to directly: no bootstrap room, no prefill
    "--disaggregation-transfer-backend", "fake",
]  # fmt: skip
PEER_PACKAGE = "aiperf"
SAMPLE_S = 0.02
_COUNTER = re.compile(rb"^sglang:generation_tokens_total\{[^}]*\} (\S+)", re.M)
TOKENIZER_SCRIPT = """
import collections, json, os, re, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
corpus, out = sys.argv[1], sys.argv[2]
words = collections.Counter(re.findall(r"\\w+", open(corpus).read()))
vocab = {"[UNK]": 0}
for w, _ in words.most_common(30000):
    vocab[w] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece(prefix="##")
os.makedirs(out, exist_ok=True)
tok.save(os.path.join(out, "tokenizer.json"))
config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}
json.dump(config, open(os.path.join(out, "tokenizer_config.json"), "w"))
"""


# ------------------------------------------------------------------ child: autotune's client
def child_ours(args: argparse.Namespace) -> int:
    """Run autotune's load generator once; print one JSON line of figures."""
    sys.path.insert(0, str(REPO))
    from autotune.loadgen import LoadSpec, run_load

    spec = LoadSpec(
        concurrency=args.concurrency,
        input_len=args.input_len,
        output_len=args.output_len,
        requests=args.requests,
        warmup_requests=0,
        max_duration_s=600,
        model=MODEL,
    )
    result = run_load(args.child, spec)
    m = result.metrics
    offset = time.time() - time.perf_counter()
    start = min(r.send_time for r in result.records) + offset
    end = max(r.end_time for r in result.records) + offset
    out = {
        "start": start,
        "end": end,
        "tok_s": m.output_throughput,
        "tokens": m.output_tokens,
        "req_s": m.request_throughput,
        "completed": m.completed,
        "failed": m.failed,
        "ttft": (m.ttft_ms.p50, m.ttft_ms.p99),
        "tpot": (m.tpot_ms.p50, m.tpot_ms.p99),
    }
    print(json.dumps(out))
    return 0


# ------------------------------------------------------------------ sampling
class Sampler:
    """Every SAMPLE_S: wall time, the server's token counter, CPU s of server and client."""

    def __init__(self, url: str, server_pid: int) -> None:
        self.url = url
        self.server_pid = server_pid
        self.client_pid: int | None = None
        self.rows: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._client_tree: list[int] = []
        self._dead_cpu: dict[int, float] = {}

    def _client_cpu(self, refresh: bool) -> float:
        if self.client_pid is None:
            return 0.0
        if refresh or not self._client_tree:
            self._client_tree = process_tree(self.client_pid)
        total = 0.0
        for pid in self._client_tree:
            with contextlib.suppress(OSError):  # exited: keep its last reading
                self._dead_cpu[pid] = cpu_seconds(pid)
        for cpu in self._dead_cpu.values():
            total += cpu
        return total

    def _run(self) -> None:
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            i = 0
            while not self._stop.is_set():
                t = time.time()
                match = _COUNTER.search(client.get(self.url + "/metrics").content)
                count = float(match.group(1)) if match else float("nan")
                self.rows.append(
                    (t, count, cpu_seconds(self.server_pid), self._client_cpu(i % 10 == 0))
                )
                i += 1
                self._stop.wait(SAMPLE_S)

    def start_client(self, pid: int) -> None:
        self.client_pid = pid
        self._client_tree = []
        self._dead_cpu = {}

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def before(self, t: float, column: int) -> float:
        """Column value of the last sample at or before wall time ``t``."""
        return max((r for r in self.rows if r[0] <= t), key=lambda r: r[0])[column]

    def after(self, t: float, column: int) -> float:
        """Column value of the first sample at or after wall time ``t``."""
        return min((r for r in self.rows if r[0] >= t), key=lambda r: r[0])[column]

    def at(self, t: float, column: int) -> float:
        """Column value interpolated at wall time ``t``."""
        rows = self.rows
        lo = max((r for r in rows if r[0] <= t), key=lambda r: r[0], default=rows[0])
        hi = min((r for r in rows if r[0] >= t), key=lambda r: r[0], default=rows[-1])
        if hi[0] == lo[0]:
            return lo[column]
        return lo[column] + (hi[column] - lo[column]) * (t - lo[0]) / (hi[0] - lo[0])

    def active_window(self, t0: float, t1: float) -> tuple[float, float, float]:
        """(first, last, tokens): counter changes between wall times t0 and t1."""
        rows = [r for r in self.rows if t0 <= r[0] <= t1]
        changed = [(a, b) for a, b in zip(rows, rows[1:], strict=False) if b[1] > a[1]]
        if not changed:
            return t0, t1, 0.0
        first, last = changed[0], changed[-1]
        # the counter started moving somewhere in (first[0][0], first[1][0]]: take mid-points
        start = (first[0][0] + first[1][0]) / 2
        end = (last[0][0] + last[1][0]) / 2
        return start, end, last[1][1] - first[0][1]


# ------------------------------------------------------------------ the peer
def ensure_peer(venv_dir: Path, fresh: bool) -> tuple[Path, Path]:
    """``(aiperf executable, tokenizer dir)``, installing the peer when needed."""
    exe = venv_dir / "bin" / "aiperf"
    tok = venv_dir / "autotune-tokenizer"
    if fresh and venv_dir.exists():
        subprocess.run(["rm", "-rf", str(venv_dir)], check=True)
    if not exe.exists():
        print(f"installing {PEER_PACKAGE} into {venv_dir} ...", file=sys.stderr)
        t0 = time.monotonic()
        venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
        pip = [str(venv_dir / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, PEER_PACKAGE], check=True)
        print(f"installed in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if not (tok / "tokenizer.json").exists():
        python = str(venv_dir / "bin" / "python")
        find = "import aiperf, pathlib; print(pathlib.Path(aiperf.__file__).parent)"
        root = subprocess.run([python, "-c", find], check=True, capture_output=True, text=True)
        corpus = Path(root.stdout.strip()) / "dataset" / "generator" / "assets" / "shakespeare.txt"
        subprocess.run([python, "-c", TOKENIZER_SCRIPT, str(corpus), str(tok)], check=True)
    return exe, tok


def peer_command(exe: Path, tok: Path, url: str, args: argparse.Namespace, c: int, n: int,
                 out_dir: str) -> list[str]:  # fmt: skip
    return [
        str(exe), "profile", "--model", MODEL, "--url", url, "--endpoint-type", "completions",
        "--streaming", "--tokenizer", str(tok), "--concurrency", str(c), "--request-count",
        str(n), "--synthetic-input-tokens-mean", str(args.input_len),
        "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(args.output_len),
        "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
        "--use-server-token-count", "--ui-type", "none", "--artifact-dir", out_dir,
        *(["--workers-max", str(args.peer_workers)] if args.peer_workers else []),
    ]  # fmt: skip


def peer_figures(out_dir: str) -> dict[str, Any]:
    data = json.loads((Path(out_dir) / "profile_export_aiperf.json").read_text())

    def stat(key: str, p: str) -> float | None:
        value = data.get(key, {}).get(p)
        return None if value is None else float(value)

    def wall(key: str) -> float:
        return datetime.fromisoformat(data[key]).timestamp()

    return {
        "start": wall("start_time"),
        "end": wall("end_time"),
        "tok_s": stat("output_token_throughput", "avg"),
        "tokens": stat("total_output_tokens", "avg"),
        "req_s": stat("request_throughput", "avg"),
        "completed": stat("completed_request_count", "avg"),
        "failed": None,
        "ttft": (stat("time_to_first_token", "p50"), stat("time_to_first_token", "p99")),
        "tpot": (stat("inter_token_latency", "p50"), stat("inter_token_latency", "p99")),
    }


# ------------------------------------------------------------------ driver


@contextlib.contextmanager
def sim_server(
    speedup: float, stream_interval: int
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {
        **os.environ,
        "AUTOTUNE_SIM_SPEEDUP": str(speedup),
        "AUTOTUNE_SIM_KV_SCALE": "16",  # KV room for 256+ running requests
        "AUTOTUNE_SIM_LOAD_SECONDS": "0",
        "AUTOTUNE_SIM_NOISE": "0",
    }
    argv = [sys.executable, "-m", "autotune.sim.server", *SERVER_FLAGS, "--port", str(port)]
    argv += ["--stream-interval", str(stream_interval)]
    proc = subprocess.Popen(argv, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            time.sleep(0.05)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(10)


def measure(sampler: Sampler, cmd: list[str], figures: Any) -> dict[str, Any]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    sampler.start_client(proc.pid)
    out, err = proc.communicate()
    time.sleep(3 * SAMPLE_S)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    fig: dict[str, Any] = figures(out)
    t0, t1 = fig["start"], fig["end"]
    window = t1 - t0
    # The server is idle before and after each client's run: the counter's change from the
    # sample before the window to the sample after it is exactly what it generated inside.
    fig["server_tokens"] = sampler.after(t1, 1) - sampler.before(t0, 1)
    fig["server_tok_s"] = fig["server_tokens"] / window
    a0, a1, active_tokens = sampler.active_window(t0 - 1.0, t1 + 1.0)
    fig["server_active_tok_s"] = active_tokens / (a1 - a0) if a1 > a0 else float("nan")
    fig["client_cpu"] = 100 * (sampler.at(t1, 3) - sampler.at(t0, 3)) / window
    fig["server_cpu"] = 100 * (sampler.at(t1, 2) - sampler.at(t0, 2)) / window
    fig["window"] = window
    return fig


def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: Sequence[tuple[str, int, dict[str, Any]]]) -> str:
    head = (
        "| client | C | output tok/s (client) | server count, same window | ratio | server, "
        "own active window | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | client CPU | "
        "server CPU |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, c, f in rows:
        lines.append(
            f"| {name} | {c} | {fmt(f['tok_s'])} | {fmt(f['server_tok_s'])} | "
            f"{f['tok_s'] / f['server_tok_s']:.4f} | {fmt(f['server_active_tok_s'])} | "
            f"{fmt(f['req_s'], ',.1f')} | "
            f"{fmt(f['ttft'][0], '.1f')} / {fmt(f['ttft'][1], '.1f')} | "
            f"{fmt(f['tpot'][0], '.2f')} / {fmt(f['tpot'][1], '.2f')} | "
            f"{f['client_cpu']:.0f}% | {f['server_cpu']:.0f}% |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--rounds", type=int, default=16, help="requests per run = rounds x C")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--speedup", type=float, default=512.0)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--peer", choices=("aiperf", "none"), default="aiperf")
    p.add_argument("--peer-venv", type=Path, default=Path.home() / ".cache/autotune-bench/aiperf")
    p.add_argument(
        "--peer-workers", type=int, default=0, help="AIPerf --workers-max (0: its default)"
    )
    p.add_argument("--fresh-peer", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.concurrency = args.concurrency[0]
        return child_ours(args)
    peer = ensure_peer(args.peer_venv, args.fresh_peer) if args.peer != "none" else None
    rows: list[tuple[str, int, dict[str, Any]]] = []
    load = os.getloadavg()
    with (
        sim_server(args.speedup, args.stream_interval) as (url, server),
        Sampler(url, server.pid) as sampler,
    ):
        for c in args.concurrency:
            n = args.rounds * c
            ours = [sys.executable, __file__, "--child", url, "--concurrency", str(c)]
            ours += ["--requests", str(n), "--input-len", str(args.input_len)]
            ours += ["--output-len", str(args.output_len)]
            rows.append(("autotune", c, measure(sampler, ours, lambda out: json.loads(out))))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
            if peer is not None:
                with tempfile.TemporaryDirectory(prefix="aiperf-") as out_dir:
                    cmd = peer_command(*peer, url, args, c, n, out_dir)
                    fig = measure(sampler, cmd, lambda _o, d=out_dir: peer_figures(d))
                    rows.append(("AIPerf", c, fig))
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(
        f"\nsim decode server x{args.speedup:g}, stream interval {args.stream_interval}, "
        f"{args.input_len} in / {args.output_len} out tokens, {args.rounds} x C requests per "
        f"run, no warm-up; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
