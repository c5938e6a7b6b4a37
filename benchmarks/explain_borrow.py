"""How many restarts ``autotune explain`` of the H200 dense winner needs, with and without the
check study's fresh-start runs borrowed (``--runs-from``): the planner replayed, no GPU.

On the H200 a restart of the 7B model costs two to three minutes and a device session holds
about ten, so the explanation's restarts decide how many sessions it takes. This replays the
product's planner (:mod:`autotune.explain.planner`, through ``tests/explain/explain_replay``,
the loop ``Explainer.run`` runs) over the stored study's real change set (the winner #21 of
``benchmarks/h200/vllm-h200-dense.db`` against the space's baseline, with its stored prior
noise), answering each measurement from a model fitted to what the H200 measured: vLLM's
defaults 4,404 tok/s (the check study's mean), fp8 weights x1.27 (#23, the winner without
them, served what the defaults serve), fp8 KV x1.03 (#24, the winner without it, 5,560),
every other change x1.00 (none measurable in the study), times log-normal run-to-run noise
(``--noise``, 3% by default: the check study's three runs of each configuration spread
3.5-8%, the study's re-measurements 1.1%). Borrowed: the 9 runs that
:func:`autotune.explain.borrowed.borrowable_runs` takes from
``benchmarks/h200/vllm-h200-dense-check.db`` (defaults, hand-picked, winner; 3 each), with
their measured values; with ``--own-runs`` besides, what the dense study itself lends
(:func:`autotune.explain.borrowed.own_terms`: not the winner's configuration, at most
``repeats - 1`` runs of any other, counting the check study's): its trials #23 and #24, the
winner without fp8 weights and without fp8 KV, and what else of the plan it measured.

    .venv/bin/python benchmarks/explain_borrow.py --seeds 200

Then the drift between occasions (``--drift``, 17% by default, the H100s of issue 28): the
explanation's machine reading below the check's, what each change bought with the check's
lent runs left out once they read apart (the product) and kept (the drift check off). Last,
the dense plan over two device sessions on two GPUs (``--first`` runs on the first): the
explanation's own runs on the earlier GPU compared with the later one's like a lending
study's (the product) or pooled as one occasion (that check off).

Prints Markdown tables (BENCHMARKS.md, "Explaining the H200 winner: the plan").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "explain"))

import optuna  # noqa: E402
from explain_replay import explain, replay  # noqa: E402

import autotune.explain.planner as planner_module  # noqa: E402
from autotune.explain import ChangeSet, ExplainRun, ExplainSettings, Planner  # noqa: E402
from autotune.explain.borrowed import borrowable_runs, own_terms  # noqa: E402
from autotune.explain.occasions import occasions as _occasions  # noqa: E402
from autotune.results import best_estimate  # noqa: E402
from autotune.space import load_space  # noqa: E402

H200 = REPO / "benchmarks" / "h200"
DEFAULTS_TOK_S = 4403.8
EFFECTS = {"quantization": 1.27, "kv_cache_dtype": 1.03}


def truth(baseline: dict[str, object]) -> object:
    def value(config: dict[str, object]) -> float:
        v = DEFAULTS_TOK_S
        for lever, factor in EFFECTS.items():
            if config.get(lever) != baseline.get(lever):
                v *= factor
        return v

    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--drift", type=float, default=0.17, help="the check's machine above this one")
    ap.add_argument("--first", type=int, default=6, help="runs on the first machine (one session)")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(REPO / "search_spaces" / "vllm-h200.yaml")
    dense = optuna.load_study(
        study_name="vllm-h200-dense", storage=f"sqlite:///{H200 / 'vllm-h200-dense.db'}"
    )
    check = optuna.load_study(
        study_name="vllm-h200-dense-check",
        storage=f"sqlite:///{H200 / 'vllm-h200-dense-check.db'}",
    )
    estimate = best_estimate(dense)
    assert estimate is not None
    winner = estimate.trial
    offered = borrowable_runs(check, space=space, engine_version=winner.engine_version)
    baseline = space.baseline_params()
    changes = ChangeSet(space, baseline=baseline, winner=winner.config)
    print(
        f"winner #{winner.number}: {len(changes.changes)} changes ({', '.join(changes.names)}); "
        f"borrowed {offered.summary()}; {args.seeds} seeds, noise {100 * args.noise:.0f}%\n"
    )
    print("| explain settings | borrowed | restarts: median (10-90%) | minimal winner keeps "
          "fp8 weights, at most fp8 KV besides |")  # fmt: skip
    print("|---|---|---|---|")
    for label, settings in (
        (
            "--repeats 2 --no-path --no-minimal (what each change bought)",
            ExplainSettings(repeats=2, max_repeats=4, path=False, minimal=False),
        ),
        ("--repeats 2 --no-path", ExplainSettings(repeats=2, max_repeats=4, path=False)),
        ("defaults (--repeats 3, path, minimal)", ExplainSettings()),
    ):
        lent = _lent(offered.runs)
        own_leave, per_config = own_terms(changes, settings.repeats)
        own = borrowable_runs(
            dense, space=space, engine_version=winner.engine_version, leave=own_leave,
            per_config=per_config, held={k: len(v) for k, v in lent.items()},
        )  # fmt: skip
        arms = {
            "none": {},
            f"{len(offered.runs)} runs": lent,
            f"{len(offered.runs)} + {len(own.runs)} own (--own-runs: "
            f"{', '.join(_number(r.source) for r in own.runs)})": _lent(offered.runs + own.runs),
        }
        for arm, borrowed in arms.items():
            restarts, small = [], 0
            for seed in range(args.seeds):
                planner = Planner(
                    changes,
                    settings,
                    winner=winner.number,
                    prior_noise=(estimate.noise_sd, estimate.noise_df),
                )
                done = replay(
                    planner,
                    truth(baseline),  # type: ignore[arg-type]
                    seed=seed,
                    noise=args.noise,
                    runs={k: list(v) for k, v in borrowed.items()} or None,
                )
                restarts.append(len(done.measured))
                kept = set(planner.kept(done.state)) if done.state.order is not None else None
                small += (
                    kept is not None and settings.minimal and "quantization" in kept
                    and kept <= set(EFFECTS)
                )  # fmt: skip
            q = statistics.quantiles(restarts, n=10)
            print(
                f"| {label} | {arm} | {statistics.median(restarts):.0f} "
                f"({q[0]:.0f}-{q[-1]:.0f}) | "
                + (f"{100 * small / args.seeds:.0f}% |" if settings.minimal else "- |")
            )
    case = Case(changes, estimate, baseline, args.seeds, args.noise, args.drift)
    drift_table(case, _lent(offered.runs))
    leave, per_config = own_terms(changes, 2)
    own = borrowable_runs(
        dense, space=space, engine_version=winner.engine_version, leave=leave,
        per_config=per_config, held={k: len(v) for k, v in _lent(offered.runs).items()},
    )  # fmt: skip
    machines_table(case, _lent(offered.runs + own.runs), first=args.first)


class _Tally:
    """What the replays of one arm read of the fp8 weights' contribution, against the truth
    on the machine where the explanation ends."""

    def __init__(self, fp8: float) -> None:
        self.fp8 = fp8
        self.restarts: list[int] = []
        self.left = 0
        self.bought: list[float] = []
        self.covered = 0
        self.widths: list[float] = []

    def add(self, planner: Planner, done: Any, restarts: int, left: bool) -> None:
        self.restarts.append(restarts)
        self.left += left
        e = explain(planner, done)
        x = next(x.contribution for x in e.effects if x.change == "quantization")
        assert x is not None
        self.bought.append(x.value)
        if x.low is not None and x.high is not None:
            self.covered += x.low <= self.fp8 <= x.high
            self.widths.append(x.high - x.low)

    def cells(self, *, width: bool) -> str:
        n, q = len(self.restarts), statistics.quantiles(self.restarts, n=10)
        return (
            f"{statistics.median(self.restarts):.0f} ({q[0]:.0f}-{q[-1]:.0f}) | "
            f"{100 * self.left / n:.0f}% | {statistics.median(self.bought):,.0f} "
            f"({self.fp8:,.0f}) | "
            + (f"{statistics.median(self.widths):,.0f} | " if width else "")
            + f"{100 * self.covered / n:.0f}% |"
        )


def _planner(changes: ChangeSet, estimate: Any) -> Planner:
    """The planner of ``--repeats 2 --no-path --no-minimal`` with the study's prior noise."""
    settings = ExplainSettings(repeats=2, max_repeats=4, path=False, minimal=False)
    return Planner(
        changes, settings, winner=estimate.trial.number,
        prior_noise=(estimate.noise_sd, estimate.noise_df),
    )  # fmt: skip


def _scaled(base_truth: Any, changes: ChangeSet, factor: float) -> tuple[Any, float]:
    """The truth on a machine reading ``factor`` x the model, and fp8's contribution there."""

    def there(config: Any) -> float:
        return factor * base_truth(config)  # type: ignore[no-any-return]

    fp8 = there(changes.winner_config) - there(changes.revert_alone("quantization")[0].config)
    return there, fp8


@dataclass(frozen=True)
class Case:
    """The dense winner's change set, its study's estimate (the prior noise), the space's
    baseline, and the replay's seeds, noise and drift between machines."""

    changes: ChangeSet
    estimate: Any
    baseline: Any
    seeds: int
    noise: float
    drift: float


def drift_table(case: Case, lent: dict[str, list[ExplainRun]]) -> None:
    """What each change bought (``--repeats 2 --no-path --no-minimal``, the check's 9 runs
    lent) when the explanation's machine reads ``1 / (1 + drift)`` of the check's, as the
    H100s of issue 28 did: the product (lent runs that read apart are left out) against
    keeping them (the drift check switched off), by the fp8 weights' contribution."""
    print(
        "\n| machine vs the check's | lent runs that read apart | restarts: median (10-90%) "
        "| check left out | fp8 weights bought: median (truth) | 95% interval covers it |"
    )
    print("|---|---|---|---|---|---|")
    changes, estimate, seeds, noise = case.changes, case.estimate, case.seeds, case.noise
    for factor in (1.0, 1 / (1 + case.drift)):
        here, fp8 = _scaled(truth(case.baseline), changes, factor)
        for keep in (False, True):
            if keep:
                planner_module.occasions = lambda *a, **k: []  # type: ignore[assignment]
            tally = _Tally(fp8)
            for seed in range(seeds):
                planner = _planner(changes, estimate)
                done = replay(planner, here, seed=seed, noise=noise,
                              runs={k: list(v) for k, v in lent.items()})  # fmt: skip
                tally.add(planner, done, len(done.measured), bool(done.state.left_out))
            planner_module.occasions = _occasions
            arm = "kept" if keep else "left out (the product)"
            print(f"| {100 * (factor - 1):+.1f}% | {arm} | {tally.cells(width=False)}")


GPU_A, GPU_B = "GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-0000"


def machines_table(case: Case, lent: dict[str, list[ExplainRun]], *, first: int) -> None:
    """The dense plan of ``scripts/h200/run.sh`` (the check's 9 runs and the study's own
    lent, ``--repeats 2 --no-path --no-minimal``) over two device sessions: ``first`` runs
    on one GPU, which reads like the check's, the rest on another reading ``1 / (1 + drift)``
    of it (or the same). The product (runs on the earlier GPU are an occasion of their own:
    :func:`autotune.explain.occasions.by_occasion`) against the machines check switched off
    (the lending studies' check stays on), by the fp8 weights' contribution on the second
    GPU, where the explanation ends."""
    print(
        f"\n| second GPU vs the first (first: {first} runs) | machines told apart "
        "| restarts: median (10-90%) | first GPU left out | fp8 weights bought: median "
        "(truth there) | 95% interval: median width | covers it |"
    )
    print("|---|---|---|---|---|---|---|")
    changes, estimate, seeds, noise = case.changes, case.estimate, case.seeds, case.noise
    base_truth = truth(case.baseline)
    identity = planner_module.by_occasion
    for factor in (1.0, 1 / (1 + case.drift)):
        there, fp8 = _scaled(base_truth, changes, factor)
        for off in (False, True):
            if off:
                planner_module.by_occasion = lambda runs: {k: list(v) for k, v in runs.items()}
            tally = _Tally(fp8)
            for seed in range(seeds):
                planner = _planner(changes, estimate)
                one = replay(planner, base_truth, seed=seed, noise=noise,  # type: ignore[arg-type]
                             runs={k: list(v) for k, v in lent.items()}, budget=first,
                             machine=GPU_A)  # fmt: skip
                done = replay(planner, there, seed=seed, noise=noise, runs=one.runs,
                              state=one.state, machine=GPU_B)  # fmt: skip
                left = any(s.startswith("(this explanation on") for s in done.state.left_out)
                tally.add(planner, done, len(one.measured) + len(done.measured), left)
            planner_module.by_occasion = identity
            arm = "off" if off else "yes (the product)"
            print(f"| {100 * (factor - 1):+.1f}% | {arm} | {tally.cells(width=True)}")


def _number(source: str | None) -> str:
    """``#N`` (``#N/R``) of a borrowed run's origin ``STUDY#N``."""
    return "#" + (source or "").rpartition("#")[2]


def _lent(runs: list[ExplainRun]) -> dict[str, list[ExplainRun]]:
    """Borrowed runs as the explanation stores them: by configuration, in order."""
    out: dict[str, list[ExplainRun]] = {}
    for run in runs:
        stored = out.setdefault(run.key, [])
        stored.append(run.model_copy(update={"index": len(stored)}))
    return out


if __name__ == "__main__":
    main()
