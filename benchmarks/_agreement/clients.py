"""The tools' runs: their command lines and environment, one run of each, the commands shown."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotune.loadgen import run_load
from autotune.loadgen.arrivals import arrival_offsets

from .constants import SEED2_OFFSET
from .figures import Run, aiperf_figures, autotune_figures, vllm_figures
from .loads import Load, first_wave, load_spec, replayed_arrivals, spec_data, vllm_arrival_offsets
from .processes import CHILD_PLACEMENT, CpuSampler, Server, process_tree, stop, tree_cpu_seconds

VLLM_BENCH_SERVE = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm import platforms\n"
    "if platforms.current_platform.is_unspecified():  # what `vllm bench` does (cli/main.py)\n"
    "    from vllm.platforms.cpu import CpuPlatform\n"
    "    platforms.current_platform = CpuPlatform()\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
"""``vllm bench serve ARGS`` without the console script (see the module docstring)."""


# ------------------------------------------------------------------------ the tools


def vllm_args(
    server: Server, load: Load, *, seed: int, dataset: Path, tokenizer: Path, result: Path
) -> list[str]:
    """``vllm bench serve`` options for ``load`` on ``dataset`` (the prompts, in order)."""
    args = [
        "--backend", "openai", "--base-url", server.url, "--endpoint", "/v1/completions",
        "--model", server.model, "--tokenizer", str(tokenizer),
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--disable-shuffle",
        "--no-oversample", "--sharegpt-output-len", str(load.output_len),
        "--num-prompts", str(load.requests), "--ignore-eos", "--temperature", "0",
        "--seed", str(seed), "--num-warmups", str(load.warmups), "--ready-check-timeout-sec", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--save-detailed", "--result-dir", str(result.parent),
        "--result-filename", result.name, "--disable-tqdm",
    ]  # fmt: skip
    if load.closed:
        args += ["--request-rate", "inf", "--max-concurrency", str(load.concurrency)]
    else:
        args += ["--request-rate", f"{load.request_rate:g}", "--burstiness", f"{load.burstiness:g}"]
        if load.max_concurrency is not None:
            args += ["--max-concurrency", str(load.max_concurrency)]
    return args


def aiperf_args(
    exe: Path, server: Server, load: Load, *, seed: int, dataset: Path, tokenizer: Path, out: Path
) -> list[str]:
    args = [
        str(exe), "profile", "--model", server.model, "--url", server.url,
        "--endpoint-type", "completions", "--streaming", "--tokenizer", str(tokenizer),
        "--input-file", str(dataset), "--custom-dataset-type", "single_turn",
        "--dataset-sampling-strategy", "sequential", "--request-count", str(load.requests),
        "--extra-inputs", "ignore_eos:true",
        "--extra-inputs", "temperature:0", "--use-server-token-count",
        "--random-seed", str(seed), "--ui-type", "none", "--artifact-dir", str(out),
    ]  # fmt: skip
    if load.closed:
        args += ["--concurrency", str(load.concurrency)]
    else:
        pattern = "poisson" if load.burstiness == 1.0 else "gamma"
        args += ["--request-rate", f"{load.request_rate:g}", "--arrival-pattern", pattern]
        if pattern == "gamma":
            args += ["--arrival-smoothness", f"{load.burstiness:g}"]
        if load.max_concurrency is not None:
            args += ["--concurrency", str(load.max_concurrency)]
    return args


def bench_env(run_dir: Path, *, offline: bool = True) -> dict[str, str]:
    """A client's environment. AIPerf gets no HF_HUB_OFFLINE: in offline mode it resolves
    even a local tokenizer directory as a hub cache snapshot and fails (HFValidationError,
    aiperf/common/tokenizer.py ``_from_pretrained_local``); a local directory loads without."""
    env = {
        **os.environ,
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": str(run_dir),
    }
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
        if offline:
            env[key] = "1"
    return env


def run_autotune(
    server: Server, load: Load, seed: int, rnd: int, *, arm: str = "autotune",
    replay: Sequence[float] | None = None,
) -> Run:  # fmt: skip
    """One autotune run; ``replay`` (open loop): the arrival offsets to use instead of its
    own schedule (``arm`` autotune_replay)."""
    spec = load_spec(load, seed=seed, model=server.model)
    offsets: Sequence[float] | None = None
    if not load.closed:
        assert load.request_rate is not None
        offsets = (
            replay if replay is not None
            else arrival_offsets(load.requests, rate=load.request_rate,
                                 burstiness=load.burstiness, seed=seed).tolist()
        )  # fmt: skip
    # CPU read before and after, no sampling thread: it would share this process's GIL with
    # the load generator's event loop. This process's own CPU only (the server is a child).
    server_pids = process_tree(server.pid)
    cpu0, srv0 = time.process_time(), tree_cpu_seconds(server_pids)
    t0 = time.monotonic()
    with replayed_arrivals(replay) if replay is not None else contextlib.nullcontext() as built:
        res = run_load(server.url, spec)
    if replay is not None and not built:
        raise SystemExit(
            f"{arm}, round {rnd}: autotune's client built no arrival schedule through "
            "autotune.loadgen.client.ArrivalSchedule: the replay of vLLM's schedule missed"
        )
    wall = time.monotonic() - t0
    cpu1, srv1 = time.process_time(), tree_cpu_seconds(server_pids)
    records = sorted(res.records, key=lambda r: r.index)
    fig = autotune_figures(records, res.metrics, first_wave=first_wave(load), offsets=offsets)
    if offsets is not None and load.max_concurrency is None and fig.get("due_match", 0) < 0.99:
        raise SystemExit(
            f"{arm}, round {rnd}: only {100 * fig.get('due_match', 0):.0f}% of the requests "
            "were due on the schedule it was meant to run (autotune's client no longer builds "
            "its arrivals through autotune.loadgen.client.ArrivalSchedule?)"
        )
    fig["server_cpu_pct"] = 100 * (srv1 - srv0) / wall
    fig["client_cpu_pct"] = 100 * (cpu1 - cpu0) / wall
    return Run(
        arm, rnd, seed, fig, wall,
        texts=[r.text for r in records], input_lens=[r.prompt_tokens or 0 for r in records],
    )  # fmt: skip


def run_client(cmd: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path,
               server: Server) -> tuple[int, CpuSampler]:  # fmt: skip
    """Run a client command (its own session, output to ``log``), sampling CPU meanwhile."""
    with log.open("wb") as fh:
        proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=fh,
                                stderr=subprocess.STDOUT, **CHILD_PLACEMENT)  # fmt: skip
        try:
            with CpuSampler(server.pid, proc.pid, client_tree=True) as cpu:
                rc = proc.wait()
        except BaseException:
            stop(proc)
            raise
    return rc, cpu


def run_vllm(
    python: Path, server: Server, load: Load, seed: int, rnd: int, *, dataset: Path,
    tokenizer: Path, out: Path,
) -> Run:  # fmt: skip
    result = out / f"vllm-{rnd}.json"
    log = out / f"vllm-{rnd}.log"
    cmd = [
        str(python),
        "-c",
        VLLM_BENCH_SERVE,
        *vllm_args(server, load, seed=seed, dataset=dataset, tokenizer=tokenizer, result=result),
    ]
    t0 = time.monotonic()
    rc, cpu = run_client(cmd, bench_env(out), out, log, server)
    wall = time.monotonic() - t0
    if rc != 0 or not result.exists():
        raise SystemExit(f"vllm bench serve failed (exit {rc}); see {log}")
    data = json.loads(result.read_text())
    if data["completed"] + data["failed"] != load.requests:
        raise SystemExit(
            f"vllm bench serve sent {data['completed'] + data['failed']} requests, not "
            f"{load.requests}: its ShareGPT loader dropped prompts (datasets.py "
            "is_valid_sequence: 4 <= prompt tokens <= 1024, prompt + output <= 2048)"
        )
    offsets = None
    if not load.closed:
        assert load.request_rate is not None
        offsets = vllm_arrival_offsets(load.requests, load.request_rate, load.burstiness, seed)
    fig = vllm_figures(data, first_wave=first_wave(load), offsets=offsets)
    ends = [s + lat for s, lat in zip(data["start_times"], data["latencies"], strict=True)]
    fig["server_cpu_pct"], fig["client_cpu_pct"] = cpu.usage(min(data["start_times"]), max(ends))
    return Run(
        "vllm", rnd, seed, fig, wall,
        texts=list(data["generated_texts"]), input_lens=list(data["input_lens"]),
    )  # fmt: skip


def run_aiperf(
    exe: Path, server: Server, load: Load, seed: int, rnd: int, *, dataset: Path,
    tokenizer: Path, out: Path,
) -> Run:  # fmt: skip
    art = out / f"aiperf-{rnd}"
    if art.exists():
        shutil.rmtree(art)
    log = out / f"aiperf-{rnd}.log"
    cmd = aiperf_args(exe, server, load, seed=seed, dataset=dataset, tokenizer=tokenizer, out=art)
    t0 = time.monotonic()
    rc, cpu = run_client(cmd, bench_env(out, offline=False), out, log, server)
    wall = time.monotonic() - t0
    found = sorted(art.rglob("profile_export_aiperf.json"))
    if rc != 0 or not found:
        raise SystemExit(f"aiperf failed (exit {rc}); see {log}")
    data = json.loads(found[0].read_text())
    fig = aiperf_figures(data)
    with contextlib.suppress(KeyError, ValueError):  # its profiling phase, wall clock
        from datetime import datetime

        span = [datetime.fromisoformat(data[k]).timestamp() for k in ("start_time", "end_time")]
        fig["server_cpu_pct"], fig["client_cpu_pct"] = cpu.usage(*span, wall=True)
    return Run("aiperf", rnd, seed, fig, wall)


def command_lines(
    server: Server, load: Load, out: Path, tokenizer: Path, aiperf: Path | None
) -> dict[str, str]:
    """The commands of one round, for benchmarks/agreement.md (vllm's as the CLI would spell it)."""
    seed = 0
    ds = out / "round-0"
    v = vllm_args(server, load, seed=seed, dataset=ds / "sharegpt.json", tokenizer=tokenizer,
                  result=out / "vllm-0.json")  # fmt: skip
    lines = {
        "server": shlex.join([*(f"{k}={v}" for k, v in server.env.items()), *server.command]),
        "vllm": shlex.join(["vllm", "bench", "serve", *v]),
        "autotune": (
            f"run_load({server.url!r}, LoadSpec("
            + ", ".join(
                f"{k}={'SEED' if k == 'seed' else repr(v)}"
                for k, v in spec_data(load, seed=seed, model=server.model).items()
            )
            + "))"
        ),
    }
    if not load.closed:
        lines["autotune_seed2"] = f"the same with seed=SEED + {SEED2_OFFSET}"
        lines["autotune_replay"] = (
            "the same (seed=SEED) inside replayed_arrivals(vllm_arrival_offsets(N, R, B, SEED))"
        )
    if aiperf is not None:
        lines["aiperf"] = shlex.join(aiperf_args(
            aiperf, server, load, seed=seed, dataset=ds / "single_turn.jsonl",
            tokenizer=tokenizer, out=out / "aiperf-0"))  # fmt: skip
    return lines
