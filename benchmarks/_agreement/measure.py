"""The driver: start the server, run every arm round after round, collect the results."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.loadgen import run_load
from autotune.sim.levers import SERVED_NAME

from .clients import command_lines, run_aiperf, run_autotune, run_vllm
from .constants import LABELS, SEED2_OFFSET, TOOLS
from .figures import Run, identity, summarize
from .loads import Load, autotune_prompts, load_spec, vllm_arrival_offsets, write_datasets
from .processes import (
    ensure_tokenizer,
    flush_cache,
    server_figures,
    server_latency_sums,
    sim_server,
    vllm_python,
    vllm_server,
)

# ------------------------------------------------------------------------ driver


def measure(
    *, server_kind: str, load: Load, rounds: int, seed: int, out: Path,
    aiperf: Path | None = None, sim_noise: float = 0.0, warm: bool = True,
    echo: bool = True, arms: Sequence[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Start the server, run every arm ``rounds`` times in rotated order; the runs, the
    summary rows, the identity notes and the commands. ``arms``: default autotune and vllm
    (and aiperf when given), plus autotune_seed2 and autotune_replay in an open loop. The
    server's prefix cache is flushed before every run (every arm of a round sends the same
    prompts)."""
    load_spec(load, seed=seed, model=SERVED_NAME)  # a bad setting fails before any start
    if arms is None:
        arms = ["autotune", "vllm"] if load.closed else [
            "autotune", "autotune_seed2", "autotune_replay", "vllm"]  # fmt: skip
        arms += ["aiperf"] if aiperf is not None else []
    tools = list(arms)
    unknown = set(tools) - set(TOOLS)
    if unknown or (load.closed and {"autotune_seed2", "autotune_replay"} & set(tools)):
        raise SystemExit(f"arms: {sorted(tools)}; known: {TOOLS} (the two autotune_* are "
                         "open loop only)")  # fmt: skip
    if "aiperf" in tools and aiperf is None:
        raise SystemExit("arm aiperf needs --aiperf (its executable)")
    python = vllm_python()
    tokenizer = ensure_tokenizer(python)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    load_before = os.getloadavg()
    t0 = time.monotonic()
    server_cm = (
        sim_server(out, noise=sim_noise, seed=seed, prefix_cache=not load.warmups)
        if server_kind == "sim"
        else vllm_server(out, python, tokenizer)
    )
    with server_cm as server:
        if warm:  # the server's first requests, measured by nobody
            run_load(server.url, load_spec(
                Load(load.concurrency if load.closed else (load.max_concurrency or 16),
                     load.input_len, load.output_len, 2 * load.concurrency),
                seed=seed + 10_000, model=server.model))  # fmt: skip
        for rnd in range(rounds):
            s = seed + rnd
            prompts = autotune_prompts(load_spec(load, seed=s, model=server.model), server.model)
            sharegpt, jsonl = write_datasets(prompts, load.output_len, out / f"round-{rnd}")
            k = rnd % len(tools)
            for tool in tools[k:] + tools[:k]:
                flush_cache(server.url)
                before = server_latency_sums(server.url)
                if tool == "autotune":
                    run = run_autotune(server, load, s, rnd)
                elif tool == "autotune_seed2":
                    run = run_autotune(server, load, s + SEED2_OFFSET, rnd, arm=tool)
                elif tool == "autotune_replay":
                    assert load.request_rate is not None
                    schedule = vllm_arrival_offsets(
                        load.requests, load.request_rate, load.burstiness, s
                    )
                    run = run_autotune(server, load, s, rnd, arm=tool, replay=schedule)
                elif tool == "vllm":
                    run = run_vllm(python, server, load, s, rnd, dataset=sharegpt,
                                   tokenizer=tokenizer, out=out)  # fmt: skip
                else:
                    assert aiperf is not None
                    run = run_aiperf(aiperf, server, load, s, rnd, dataset=jsonl,
                                     tokenizer=tokenizer, out=out)  # fmt: skip
                run.figures.update(
                    server_figures(before, server_latency_sums(server.url), load.output_len)
                )
                runs.append(run)
                if echo:
                    f = run.figures
                    print(
                        f"round {rnd} {LABELS[tool]:>16}: {f['output_tok_s']:9.1f} tok/s, "
                        f"TTFT p50 {f['ttft_p50']:.1f} ms, TPOT p50 {f['tpot_p50']:.2f} ms "
                        f"({run.wall_s:.0f} s)",
                        file=sys.stderr, flush=True,
                    )  # fmt: skip
        commands = command_lines(server, load, out, tokenizer, aiperf)
    result = {
        "server": server_kind,
        "load": load.__dict__,
        "rounds": rounds,
        "seed": seed,
        "sim_noise": sim_noise if server_kind == "sim" else None,
        "wall_s": time.monotonic() - t0,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "runs": [r.public() for r in runs],
        "summary": [r.public() for r in summarize(runs)],
        "identity": identity(runs),
        "commands": commands,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    result["_runs"] = runs
    return result
