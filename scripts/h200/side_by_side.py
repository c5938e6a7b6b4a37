"""Queue the default, the hand-picked best and autotune's winner into one new study, so that
`autotune run` measures them side by side on the same machine with the same load generator
(the hand figures came from other clients, so they are not comparable as such).

    python3 scripts/h200/side_by_side.py --winner-from sqlite:///studies/transformers-serve-h200.db
    python3 -m autotune run --study transformers-serve-h200-check --trials 3

    python3 scripts/h200/side_by_side.py --study vllm-h200-dense-check \
        --winner-study vllm-h200-dense --winner-from sqlite:///studies/vllm-h200-dense.db
    python3 -m autotune run --study vllm-h200-dense-check --trials 3

    # later, one more configuration of the tuning study into the same check study:
    python3 scripts/h200/side_by_side.py --study vllm-h200-dense-check \
        --winner-study vllm-h200-dense --winner-from sqlite:///studies/vllm-h200-dense.db --also 19
    python3 -m autotune run --study vllm-h200-dense-check --trials 4

    # another arm's winner (the random-search arm's) and a trial of another study:
    python3 scripts/h200/side_by_side.py --study vllm-h200-dense-check \
        --winner-study vllm-h200-dense --winner-from sqlite:///studies/vllm-h200-dense.db \
        --also vllm-h200-dense-random:best --also vllm-h200-dense-random:7

A check study (studies/*-check.yaml) has no early abort and re-measures its configurations
from fresh processes (the defaults three times: issue 28's "vLLM's defaults (3 runs)").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# --continuous-batching --cb-use-cuda-graph --cb-max-batch-tokens 512, every other lever at
# its default (block size 256, KV sized from free memory, 90% of it).
TRANSFORMERS_HAND_PICKED: dict[str, bool | int | float | str] = {
    "continuous_batching": True,
    "attn_implementation": "default",
    "dtype": "auto",
    "cb_cuda_graph": True,
    "cb_block_size": 256,
    "cb_kv_manual": False,
    "cb_max_batch_tokens": 512,
    "cb_max_memory_percent": 0.9,
}
# DOMAIN.md §8b, picked by hand on the 7B model: fp8 weights + fp8 KV + async scheduling (on by
# default in 0.26.0) + 16k batched tokens; 9,164 tok/s at C=64, 1,024 in / 256 out.
VLLM_DENSE_HAND_PICKED: dict[str, bool | int | float | str] = {
    "quantization": "fp8",
    "kv_cache_dtype": "fp8",
    "max_num_batched_tokens": 16384,
}
# DOMAIN.md §8b on the MoE model: --quantization fp8 (36% slower than the defaults by hand).
VLLM_MOE_HAND_PICKED: dict[str, bool | int | float | str] = {"quantization": "fp8"}
HAND_PICKED = {
    "transformers-serve-h200-check": TRANSFORMERS_HAND_PICKED,
    "vllm-h200-dense-check": VLLM_DENSE_HAND_PICKED,
    "vllm-h200-moe-check": VLLM_MOE_HAND_PICKED,
    "vllm-h100-moe-check": VLLM_MOE_HAND_PICKED,  # the MoE side-by-side on an H100
}
"""Check study -> the hand-picked configuration, as changes from the space's baseline."""


def main() -> None:
    sys.path.insert(0, str(ROOT))
    import optuna

    from autotune.results import best_estimate
    from autotune.space import load_space
    from autotune.study.definition import load_study_definition

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--winner-from", required=True, help="storage URL of the tuning study")
    ap.add_argument("--winner-study", default="transformers-serve-h200")
    ap.add_argument("--study", default="transformers-serve-h200-check")
    ap.add_argument("--storage", default=None, help="default sqlite:///studies/STUDY.db")
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="[STUDY:]N|STUDY:best",
        help="queue trial N of the tuning study (or of STUDY, or STUDY's winner) too, labelled "
        "'#N of STUDY' (again: nothing); the check study may already hold its other trials. "
        "STUDY's storage: studies/STUDY.db where it exists, else benchmarks/h200/STUDY.db "
        "(benchmarks/h100/ for a study named *-h100-*)",
    )
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    if args.study not in HAND_PICKED:
        raise SystemExit(f"no hand-picked configuration for {args.study} ({sorted(HAND_PICKED)})")
    check = ROOT / "studies" / f"{args.study}.yaml"
    space = load_space(check.parent / load_study_definition(check).space)
    hand = {**space.baseline_params(), **HAND_PICKED[args.study]}
    tuned = optuna.load_study(study_name=args.winner_study, storage=args.winner_from)
    best = best_estimate(tuned)
    if best is None:
        raise SystemExit(f"{args.winner_study}: no feasible trial to take the winner from")
    number = best.trial.number
    winner = dict(tuned.trials[number].params)
    storage = args.storage or f"sqlite:///{ROOT}/studies/{args.study}.db"
    study = optuna.create_study(
        study_name=args.study, storage=storage, direction="maximize", load_if_exists=True
    )
    labels = {t.user_attrs.get("label") for t in study.trials}
    if study.trials and not args.also:
        raise SystemExit(f"{args.study} already has trials in {storage}")
    if not study.trials:
        study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
        for name, params in (("hand-picked", hand), (f"winner #{number}", winner)):
            study.enqueue_trial(params, user_attrs={"label": name})
            print(f"queued {name}: {params}")
    for also in args.also:
        # A configuration the tuning study could not judge (e.g. cut by a faulty early abort),
        # or another arm's winner: measured here without an abort, beside the others, from a
        # fresh start.
        source, n = _also(also, args.winner_study, tuned)
        name = f"#{n} of {source.study_name}"
        if name in labels:
            print(f"{name}: already in {args.study}")
            continue
        study.enqueue_trial(dict(source.trials[n].params), user_attrs={"label": name})
        labels.add(name)
        print(f"queued {name}: {source.trials[n].params}")


def _also(spec: str, winner_study: str, tuned: Any) -> tuple[Any, int]:
    """`--also`'s study and trial number: "N" (of the tuning study), "STUDY:N", "STUDY:best"."""
    import optuna

    from autotune.results import best_estimate
    from benchmarks.h200_side_by_side import card_of

    name, _, which = spec.rpartition(":")
    if which != "best" and not which.isdigit():
        raise SystemExit(f"--also {spec}: expected N, STUDY:N or STUDY:best")
    source = tuned
    if name and name != winner_study:
        local = ROOT / "studies" / f"{name}.db"
        db = local if local.exists() else card_of(name)[1] / f"{name}.db"
        if not db.exists():
            raise SystemExit(f"--also {spec}: no study database {local} or {db}")
        source = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    if which == "best":
        best = best_estimate(source)
        if best is None:
            raise SystemExit(f"--also {spec}: {source.study_name} has no feasible trial")
        return source, int(best.trial.number)
    n = int(which)
    if not 0 <= n < len(source.trials) or not source.trials[n].params:
        raise SystemExit(
            f"--also {spec}: {source.study_name} has no trial {n} with a configuration"
        )
    return source, n


if __name__ == "__main__":
    main()
