"""The minimal-winner search with and without the drop-together attempt, on a family of
winners: restarts, and how good the minimal winner truly is.

The explanation's planner (``tests/explain/explain_replay``, the loop ``Explainer.run``
runs, no servers) explains winners of independent bool levers whose true effects are known
(the throughput is 100 x the product of the factors of the levers turned on), measured with
seeded log-normal run-to-run noise. The cases span what a study's winner carries: one large
change and passengers that do nothing, two real changes among passengers (the H200 dense
winner: fp8 weights x1.27, fp8 KV x1.03), several real ones, small ones around the
tolerance, and a slightly harmful passenger. For each, ``drop_together`` on (the default)
and off (``--one-at-a-time``), at 1%, 3% and 5% noise, ``repeats`` 2 and ``max_repeats`` 4
(the H200 settings), tolerance 3%, no path:

* restarts of the minimal search (the ablation's are the same in both modes);
* **within**: the share of explanations whose minimal winner truly serves at least ``1 -
  tolerance`` of the winner (what the search promises);
* **kept**: the mean number of changes the minimal winner keeps (fewer is better), beside
  the fewest that would truly be within the tolerance.

    .venv/bin/python benchmarks/explain_elimination.py --seeds 40
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "explain"))

from explain_replay import replay  # noqa: E402
from explain_spaces import bool_levers  # noqa: E402

from autotune.explain import ChangeSet, ExplainSettings, Planner  # noqa: E402

CASES: dict[str, list[float]] = {
    "one large, 5 passengers": [1.30, 1.0, 1.0, 1.0, 1.0, 1.0],
    "H200 dense: x1.27, x1.03, 5 passengers": [1.27, 1.03, 1.0, 1.0, 1.0, 1.0, 1.0],
    "three real (30%, 10%, 5%), 3 passengers": [1.30, 1.10, 1.05, 1.0, 1.0, 1.0],
    "small ones (2%, 1.5%, 1%, 1%)": [1.02, 1.015, 1.01, 1.01],
    "one large, a harmful passenger (-1%), 3 passengers": [1.30, 0.99, 1.0, 1.0, 1.0],
}
TOLERANCE = 0.03


def fewest_within(factors: list[float]) -> int:
    """The fewest changes whose configuration truly serves >= 1 - tolerance of the winner."""
    total = math.prod(factors)
    for k in range(len(factors) + 1):
        for kept in itertools.combinations(range(len(factors)), k):
            if math.prod(factors[i] for i in kept) >= (1 - TOLERANCE) * total:
                return k
    return len(factors)


def run_case(
    factors: list[float], noise: float, together: bool, seeds: int, tmp: Path
) -> dict[str, float]:
    names = [f"c{i}" for i in range(len(factors))]
    space = bool_levers(tmp, names)
    winner = {n: True for n in names}

    def truth(config: Mapping[str, object]) -> float:
        return 100.0 * math.prod(f for n, f in zip(names, factors, strict=True) if config[n])

    settings = ExplainSettings(
        repeats=2, max_repeats=4, path=False, tolerance=TOLERANCE, drop_together=together
    )
    restarts, within, kept_n = [], 0, []
    for seed in range(seeds):
        planner = Planner(ChangeSet(space, baseline=space.baseline_params(), winner=winner),
                          settings, winner=1)  # fmt: skip
        done = replay(planner, truth, seed=seed, noise=noise)  # type: ignore[arg-type]
        restarts.append(sum(1 for m in done.measured if m.phase == "minimal"))
        kept = set(planner.kept(done.state))
        within += truth({n: n in kept for n in names}) >= (1 - TOLERANCE) * truth(winner)
        kept_n.append(len(kept))
    return {
        "restarts": statistics.mean(restarts),
        "within": within / seeds,
        "kept": statistics.mean(kept_n),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    args = ap.parse_args()
    print(
        "| winner's changes (true factors) | noise | minimal-search restarts: together / one "
        "at a time | within tolerance | changes kept (fewest within) |"
    )
    print("|---|---:|---:|---:|---:|")
    totals: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for (case, factors), noise in itertools.product(CASES.items(), (0.01, 0.03, 0.05)):
            got = {t: run_case(factors, noise, t, args.seeds, Path(tmp)) for t in (True, False)}
            for t in (True, False):
                totals[t].append(got[t])
            print(
                f"| {case} | {100 * noise:.0f}% | {got[True]['restarts']:.1f} / "
                f"{got[False]['restarts']:.1f} | {100 * got[True]['within']:.0f}% / "
                f"{100 * got[False]['within']:.0f}% | {got[True]['kept']:.2f} / "
                f"{got[False]['kept']:.2f} ({fewest_within(factors)}) |"
            )
    mean = {t: {k: statistics.mean(r[k] for r in totals[t]) for k in totals[t][0]} for t in totals}
    print(
        f"| **all {len(totals[True])} cases** | | **{mean[True]['restarts']:.1f} / "
        f"{mean[False]['restarts']:.1f}** | {100 * mean[True]['within']:.0f}% / "
        f"{100 * mean[False]['within']:.0f}% | {mean[True]['kept']:.2f} / "
        f"{mean[False]['kept']:.2f} | "
    )


if __name__ == "__main__":
    main()
