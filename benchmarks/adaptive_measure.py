"""Adaptive measurement and early abort vs fixed-length measurement, on the simulated deployment.

The default study's load (C=16, 256 in / 128 out, 16 warm-up requests) on the bundled
simulated prefill -> router -> decode deployment (``launchers/sim-dsv4-flash-pd.yaml``,
``sim_speedup: 8``) for a few configurations of the bundled space (fast, mid, slow). Per
configuration, with the services started once (the simulator draws its per-process noise
at start, so every run of a configuration sees the same server):

1. a long reference run (``--ref-rounds`` x C requests): the "true" throughput;
2. fixed-length runs of 32 (the study's setting), 64, 128 and 256 requests;
3. adaptive runs (``target_rel_ci`` 0.05 and 0.02, at least 32 requests, capped at
   ``--max-s``);

each repeated ``--reps`` times, side by side in one run. Error = |run / reference - 1|
against the reference's steady-state rate, for the metric every trial stores
(``Metrics.output_throughput``: tokens / first dispatch to last completion, start-up ramp and
tail included) and, for adaptive runs, also for the live estimate's steady-state rate
(``BenchResult.estimate``). Time = the measure phase (warm-up is the same for every method
and left out), in the simulator's seconds (x8 for the modeled hardware). "Equal accuracy":
the shortest fixed length whose mean error is no worse than the adaptive run's, and the
ratio of their times.

Early abort (rule: abort once the upper 95% bound < 0.9 x incumbent): each configuration
is measured adaptively (target 0.02) against an incumbent of 2x its reference throughput
(the configuration is at 50% of the incumbent: how soon is it cut?) and against one of
1/0.95 x its reference (within 5%: how often is it wrongly cut?). Usage:

    .venv/bin/python benchmarks/adaptive_measure.py --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.deployment import load_deployment  # noqa: E402
from autotune.launch.local import LocalLauncher  # noqa: E402
from autotune.loadgen import BenchResult, LiveEstimate, LoadSpec, run_load  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.sim.optimum import true_optimum  # noqa: E402
from autotune.space import load_space  # noqa: E402

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
DEPLOYMENT = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
C, INPUT_LEN, OUTPUT_LEN = 16, 256, 128
FIXED = (32, 64, 128, 256)
TARGETS = (0.05, 0.02)
ABORT_FACTOR = 0.9


def configs() -> dict[str, dict[str, object]]:
    """fast = the model's optimum; mid and slow = it with MXFP4/Marlin, or the Triton
    sparse-MLA kernel."""
    opt = dict(true_optimum(concurrency=C, input_len=INPUT_LEN, output_len=OUTPUT_LEN).levers)
    fast_nospec = {
        **opt,
        "speculative": "off",
        "cuda_graph_bs_decode": "unset",
        "cuda_graph_max_bs_decode": 32,
        "max_running_requests": 32,
    }
    return {
        "fast": opt,
        "mid": {**fast_nospec, "moe_runner_backend": "marlin", "checkpoint": "mxfp4"},
        "slow": {**fast_nospec, "sm120_flashmla_backend": "triton"},
    }


@dataclass
class Run:
    tok_s: float
    """``Metrics.output_throughput``: tokens / (first dispatch to last completion)."""
    seconds: float
    steady: float
    """The live estimate's steady-state rate (start-up ramp excluded)."""
    stop: str | None = None
    aborted: str | None = None


def spec(**kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "concurrency": C,
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        "warmup_requests": C,
        "request_timeout_s": 120,
        "max_duration_s": 600,
    }
    return LoadSpec.model_validate({**base, **kw})


def _track(est: LiveEstimate) -> str | None:
    return None  # never aborts: only makes run_load track the live estimate


def measure(url: str, s: LoadSpec, abort_if: Callable[[LiveEstimate], str | None] = _track) -> Run:
    r: BenchResult = run_load(url, s, abort_if=abort_if)
    steady = r.estimate.output_throughput if r.estimate else r.metrics.output_throughput
    return Run(r.metrics.output_throughput, r.measure_seconds, steady, r.stop_reason, r.aborted)


def summary(runs: Sequence[Run], ref: float, steady: bool = False) -> tuple[float, float, float]:
    """(mean |error| %, max |error| %, mean seconds) of the metric (or the steady estimate)."""
    errors = [abs((r.steady if steady else r.tok_s) / ref - 1) * 100 for r in runs]
    return statistics.mean(errors), max(errors), statistics.mean(r.seconds for r in runs)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["fast", "mid", "slow"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ref-rounds", type=int, default=32, help="reference = this x C requests")
    p.add_argument("--abort-reps", type=int, default=5)
    p.add_argument("--max-s", type=float, default=60.0, help="adaptive max_duration_s (sim s)")
    p.add_argument("--fixed", type=int, nargs="+", default=list(FIXED), help="request counts")
    args = p.parse_args(argv)
    space = load_space(SPACE)
    deployment = load_deployment(DEPLOYMENT)
    names = {q.name for q in space.params if q.sampled}
    table1: list[str] = []
    table2: list[str] = []
    table3: list[str] = []
    notes: list[str] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="autotune-adaptive-") as tmp:
        launcher = LocalLauncher(run_dir=Path(tmp))
        try:
            for name in args.configs:
                params = {k: v for k, v in configs()[name].items() if k in names}
                config = space.complete(params)
                specs = render(space, deployment, config, run_dir=tmp)
                launcher.apply(specs)
                url = deployment.endpoint_url(specs)
                ref = measure(url, spec(requests=args.ref_rounds * C))
                print(f"{name}: reference {ref.tok_s:,.1f} tok/s (steady {ref.steady:,.1f}) "
                      f"in {ref.seconds:.1f} s", file=sys.stderr)  # fmt: skip
                results: dict[str, list[Run]] = {}
                for n in args.fixed:
                    results[f"fixed {n}"] = [
                        measure(url, spec(requests=n)) for _ in range(args.reps)
                    ]
                for target in TARGETS:
                    s = spec(target_rel_ci=target, requests=32, max_duration_s=args.max_s)
                    results[f"adaptive {target:g}"] = [measure(url, s) for _ in range(args.reps)]
                after = measure(url, spec(requests=args.ref_rounds * C))
                drift = (after.steady / ref.steady - 1) * 100
                notes.append(
                    f"{name}: reference {ref.steady:,.1f} tok/s before, {after.steady:,.1f} after "
                    f"({drift:+.1f}%: the shared machine's load moves the simulator's speed)"
                )
                rows = rows_accuracy(name, ref, results)
                table1 += rows
                table2 += rows_equal_accuracy(name, ref.steady, results, args.fixed)
                table3 += rows_abort(name, url, ref.steady, results["adaptive 0.02"], args)
                print("\n".join(rows), file=sys.stderr)
        finally:
            launcher.stop_all()
            launcher.close()
    print(f"\n{len(args.configs)} configurations, {args.reps} repetitions, wall "
          f"{time.monotonic() - started:.0f} s; simulator seconds (x8 = modeled)\n")  # fmt: skip
    print("\n".join(notes) + "\n")
    print("| config | reference steady tok/s (sim) | method | mean / max error | mean measure s |"
          " stop |\n|---|---|---|---|---|---|")  # fmt: skip
    print("\n".join(table1))
    print("\n| config | adaptive | its error / time | shortest fixed as accurate | its error /"
          " time | time ratio fixed / adaptive |\n|---|---|---|---|---|---|")  # fmt: skip
    print("\n".join(table2))
    print(
        f"\nAbort rule: upper 95% bound < {ABORT_FACTOR:g} x incumbent (target_rel_ci 0.02 runs)\n"
    )
    print("| config | position vs incumbent | aborted | mean measure s when cut | full "
          "adaptive measure s | time ratio |\n|---|---|---|---|---|---|")  # fmt: skip
    print("\n".join(table3))
    return 0


def rows_accuracy(name: str, ref: Run, results: Mapping[str, list[Run]]) -> list[str]:
    """Error vs the reference's steady rate: the metric, and for adaptive runs the estimate."""
    out = []
    for method, runs in results.items():
        kinds = [False, True] if method.startswith("adaptive") else [False]
        for steady in kinds:
            mean_err, max_err, secs = summary(runs, ref.steady, steady)
            stops = sorted({(r.stop or "count reached").split(":")[0] for r in runs})
            figure = "steady estimate" if steady else "metric"
            out.append(
                f"| {name} | {ref.steady:,.0f} | {method} ({figure}) | {mean_err:.1f}% / "
                f"{max_err:.1f}% | {secs:.2f} | {', '.join(stops)} |"
            )
    return out


def rows_equal_accuracy(
    name: str, ref: float, results: Mapping[str, list[Run]], fixed: Sequence[int]
) -> list[str]:
    out = []
    for target in TARGETS:
        ad = results[f"adaptive {target:g}"]
        for steady in (False, True):
            a_err, _, a_s = summary(ad, ref, steady)
            label = f"{target:g} ({'steady estimate' if steady else 'metric'})"
            match = next(
                (n for n in fixed if summary(results[f"fixed {n}"], ref)[0] <= a_err), None
            )
            if match is None:
                longest = summary(results[f"fixed {fixed[-1]}"], ref)
                out.append(
                    f"| {name} | {label} | {a_err:.1f}% / {a_s:.2f} s | none up to {fixed[-1]} | "
                    f"{longest[0]:.1f}% / {longest[2]:.2f} s | > {longest[2] / a_s:.2f} |"
                )
                continue
            f_err, _, f_s = summary(results[f"fixed {match}"], ref)
            out.append(
                f"| {name} | {label} | {a_err:.1f}% / {a_s:.2f} s | {match} requests | "
                f"{f_err:.1f}% / {f_s:.2f} s | {f_s / a_s:.2f} |"
            )
    return out


def rows_abort(
    name: str, url: str, ref: float, full: Sequence[Run], args: argparse.Namespace
) -> list[str]:
    """Adaptive (0.02) runs against an incumbent at 2x / 1/0.95x this config's rate."""
    out = []
    full_s = statistics.mean(r.seconds for r in full)
    for position, incumbent in (("50%", ref / 0.5), ("95% (within 5%)", ref / 0.95)):

        def rule(est: LiveEstimate, incumbent: float = incumbent) -> str | None:
            upper = est.upper
            if upper is not None and upper < ABORT_FACTOR * incumbent:
                return f"upper bound {upper:,.0f} < {ABORT_FACTOR:g} x incumbent"
            return None

        s = spec(target_rel_ci=0.02, requests=32, max_duration_s=args.max_s)
        runs = [measure(url, s, rule) for _ in range(args.abort_reps)]
        cut = [r for r in runs if r.aborted]
        cut_s = statistics.mean(r.seconds for r in cut) if cut else None
        out.append(
            f"| {name} | {position} | {len(cut)} of {len(runs)} | "
            f"{'-' if cut_s is None else f'{cut_s:.2f}'} | {full_s:.2f} | "
            f"{'-' if cut_s is None else f'{cut_s / full_s:.2f}'} |"
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
