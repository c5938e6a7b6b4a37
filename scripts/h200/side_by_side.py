"""Queue the default, the hand-picked best and autotune's winner into one new study, so that
`autotune run` measures them side by side on the same machine with the same load generator
(the hand figures of issue 7 came from another client, so they are not comparable as such).

    python3 scripts/h200/side_by_side.py --winner-from sqlite:///studies/transformers-serve-h200.db
    python3 -m autotune run --study transformers-serve-h200-check --trials 3

The check study (studies/transformers-serve-h200-check.yaml) has no early abort and
re-measures its top 2 three times each from fresh processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# --continuous-batching --cb-use-cuda-graph --cb-max-batch-tokens 512, every other lever at
# its default (block size 256, KV sized from free memory, 90% of it).
HAND_PICKED = {
    "continuous_batching": True,
    "attn_implementation": "default",
    "dtype": "auto",
    "cb_cuda_graph": True,
    "cb_block_size": 256,
    "cb_kv_manual": False,
    "cb_max_batch_tokens": 512,
    "cb_max_memory_percent": 0.9,
}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    import optuna

    from autotune.results import best_estimate
    from autotune.space import load_space

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--winner-from", required=True, help="storage URL of the tuning study")
    ap.add_argument("--winner-study", default="transformers-serve-h200")
    ap.add_argument("--study", default="transformers-serve-h200-check")
    ap.add_argument("--storage", default=None, help="default sqlite:///studies/STUDY.db")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    space = load_space(ROOT / "search_spaces" / "transformers-serve.yaml")
    tuned = optuna.load_study(study_name=args.winner_study, storage=args.winner_from)
    best = best_estimate(tuned)
    if best is None:
        raise SystemExit(f"{args.winner_study}: no feasible trial to take the winner from")
    number = best.trial.number
    winner = dict(tuned.trials[number].params)
    storage = args.storage or f"sqlite:///{ROOT}/studies/{args.study}.db"
    study = optuna.create_study(study_name=args.study, storage=storage, direction="maximize")
    if study.trials:
        raise SystemExit(f"{args.study} already has trials in {storage}")
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    for name, params in (("hand-picked", HAND_PICKED), (f"winner #{number}", winner)):
        study.enqueue_trial(params, user_attrs={"label": name})
        print(f"queued {name}: {params}")


if __name__ == "__main__":
    main()
