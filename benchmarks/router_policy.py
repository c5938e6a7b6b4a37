"""The real sglang-router's load-balancing policies on two simulated PD nodes.

``launchers/sim-dsv4-flash-pd-2node.yaml`` puts two prefill and two decode workers (each
node as in the bundled deployment) behind the real router; the space
``search_spaces/dsv4-flash-rtx6000-pd-2node.yaml`` makes ``--prefill-policy`` and
``--decode-policy`` levers. Where each request goes is decided by the router's own code, not
by the performance model: the model only says how fast each worker runs the batch it gets.
This measures, side by side on one set of worker processes (a policy change restarts only
the router), each policy pair's output throughput at the bundled study's load and how the
generated tokens split between the two decode workers (their ``/metrics``). Rounds alternate
the order of the pairs so machine load falls on all alike. Usage:

    .venv/bin/python benchmarks/router_policy.py --rounds 2 --workers optimum
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from autotune.deployment import load_deployment  # noqa: E402
from autotune.launch.local import LocalLauncher  # noqa: E402
from autotune.loadgen import LoadSpec, run_load  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.sim.optimum import true_optimum  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.study.definition import load_study_definition  # noqa: E402

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd-2node.yaml"
DEPLOYMENT = REPO / "launchers" / "sim-dsv4-flash-pd-2node.yaml"
STUDY = REPO / "studies" / "dsv4-flash-sim.yaml"
POLICIES = ("cache_aware", "power_of_two", "round_robin", "random")
DECODES = ("decode", "decode-b")


def generated_tokens(url: str) -> float:
    """``sglang:generation_tokens_total`` of one worker's ``/metrics``."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sglang:generation_tokens_total")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--workers", choices=("baseline", "optimum"), default="optimum",
        help="worker settings: the space's baseline or the one-node model optimum",
    )  # fmt: skip
    args = parser.parse_args()
    definition = load_study_definition(STUDY)
    load = definition.load
    space = load_space(SPACE)
    deployment = load_deployment(DEPLOYMENT)
    workers: dict[str, object] = dict(space.baseline_params())
    if args.workers == "optimum":
        found = true_optimum(
            concurrency=load.concurrency, input_len=load.input_len, output_len=load.output_len
        )
        names = {p.name for p in space.sampled_params}
        workers = {k: v for k, v in found.levers.items() if k in names}
    pairs = [(p, p) for p in POLICIES] + [("round_robin", "cache_aware")]
    results: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    shares: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    spec = LoadSpec(
        concurrency=load.concurrency,
        input_len=load.input_len,
        output_len=load.output_len,
        warmup_requests=load.concurrency,
        requests=4 * load.concurrency,
        prompt="text",
        request_timeout_s=120,
        max_duration_s=600,
    )
    with tempfile.TemporaryDirectory(prefix="autotune-router-policy-") as tmp:
        launcher = LocalLauncher(run_dir=Path(tmp))
        try:
            for round_ in range(args.rounds):
                for pair in pairs if round_ % 2 == 0 else pairs[::-1]:
                    config = space.complete(
                        {**workers, "router_prefill_policy": pair[0],
                         "router_decode_policy": pair[1]}
                    )  # fmt: skip
                    specs = render(space, deployment, config, run_dir=tmp)
                    launcher.apply(specs)
                    urls = {n: f"http://{specs[n].host}:{specs[n].port}/metrics" for n in DECODES}
                    before = {n: generated_tokens(u) for n, u in urls.items()}
                    result = run_load(deployment.endpoint_url(specs), spec)
                    made = {n: generated_tokens(u) - before[n] for n, u in urls.items()}
                    tok_s = result.metrics.output_throughput / deployment.sim_speedup
                    results[pair].append(tok_s)
                    shares[pair].append(made[DECODES[0]] / max(1.0, sum(made.values())))
                    print(f"round {round_} {pair}: {tok_s:,.1f} tok/s, decode share "
                          f"{shares[pair][-1]:.2f}", file=sys.stderr)  # fmt: skip
        finally:
            launcher.stop_all()
    print(f"workers: {args.workers}; load C={load.concurrency}, {load.input_len} in / "
          f"{load.output_len} out, {spec.requests} requests; {args.rounds} round(s)\n")  # fmt: skip
    print("| prefill policy | decode policy | output tok/s (mean) | min-max | "
          "tokens on decode 1 |")  # fmt: skip
    print("|---|---|---:|---:|---:|")
    for pair in pairs:
        runs = results[pair]
        print(f"| {pair[0]} | {pair[1]} | {statistics.mean(runs):,.1f} | "
              f"{min(runs):,.1f}-{max(runs):,.1f} | "
              f"{statistics.mean(shares[pair]):.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
