"""``autotune explain`` on the twin against the truth: the model's own contribution of each change.

The twin's servers follow a pure performance model, so every lever's true contribution to
the winner is known: ``true(winner) - true(winner without the change)``, the model's output
tok/s of each configuration at the study's load (``benchmarks/winner_noise.true_throughput``,
the configurations the servers parse from the rendered commands). This script runs a study
on the simulated deployment (or takes a stored one), runs ``autotune explain`` through the
product's own code path (restarts, probe, warm-up, measure, stored runs) and tabulates, per
change, the estimate with its 95% interval against the truth: whether the sign is right where
the true effect is above the noise, and whether the interval covers the truth. The minimal
winner's true throughput is compared with the true winner's.

    .venv/bin/python benchmarks/explain_truth.py --trials 25 --seeds 1 2 --repeats 3
    .venv/bin/python benchmarks/explain_truth.py --storage sqlite:///studies/x.db \
        --study dsv4-flash-sim
    .venv/bin/python benchmarks/explain_truth.py --trials 25 --seeds 11 12 --speedup 2

``--speedup S`` runs the simulated servers S x faster than the hardware they model instead of
the bundled launcher's 8x (a copy of the study and launcher with ``sim_speedup: S``): at 8x,
two cores cannot keep the fastest configurations' simulated clock, their tok/s fall short of
the model, and a large contribution is under-estimated; at a slower clock the servers keep
up, at the cost of wall time.

Writes a Markdown table per study to stdout and a JSON summary with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from winner_noise import true_throughput  # noqa: E402

from autotune.explain import ChangeSet, ExplainSettings, load_explanation  # noqa: E402
from autotune.results import best_estimate  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.study.definition import load_study_definition  # noqa: E402
from autotune.study.storage import load_study, open_storage  # noqa: E402

STUDY_FILE = REPO / "studies" / "dsv4-flash-sim.yaml"


def with_speedup(speedup: float, into: Path) -> Path:
    """A copy of the bundled study whose launcher runs the servers ``speedup`` x fast."""
    definition = load_study_definition(STUDY_FILE)
    launcher = definition.resolve(definition.deployment)
    text, n = re.subn(r"(?m)^sim_speedup: .*$", f"sim_speedup: {speedup:g}", launcher.read_text())
    if n != 1:
        raise SystemExit(f"{launcher}: no top-level sim_speedup: line to change")
    copy = into / launcher.name
    copy.write_text(text)
    study = STUDY_FILE.read_text()
    study = re.sub(r"(?m)^space: .*$", f"space: {definition.resolve(definition.space)}", study)
    study = re.sub(r"(?m)^deployment: .*$", f"deployment: {copy}", study)
    out = into / STUDY_FILE.name
    out.write_text(study)
    return out


def run_study(
    url: str,
    name: str,
    *,
    trials: int,
    seed: int,
    settings: ExplainSettings,
    study_file: Path = STUDY_FILE,
    explain_file: Path | None = None,
    explain_requests: int | None = None,
) -> float:
    """A study of ``trials`` trials and its explanation, through the product's Tuner.

    The explanation runs on ``explain_file``'s deployment (default: the study's) and measures
    ``explain_requests`` per run (default: the study's load)."""
    from autotune.study.runner import Tuner

    def definition_of(path: Path) -> Any:
        definition = load_study_definition(path)
        # The bundled study explains its winner at the end of run with its own settings; off
        # here, so the explanation below is measured (and timed) with the script's settings.
        return definition.model_copy(
            update={"explain": definition.explain.model_copy(update={"enabled": False})}
        )

    t0 = time.monotonic()
    tuner = Tuner(definition=definition_of(study_file), study_name=name, storage_url=url, seed=seed)
    tuner.run(n_trials=trials)
    t1 = time.monotonic()
    explaining = definition_of(explain_file or study_file)
    if explain_requests is not None:
        load = explaining.load.model_copy(
            update={"requests": explain_requests, "target_rel_ci": None}
        )
        explaining = explaining.model_copy(update={"load": load})
    again = Tuner(definition=explaining, study_name=name, storage_url=url, seed=seed)
    again.explain(settings)
    print(
        f"# study {name}: {trials} trials in {t1 - t0:.0f}s, explanation in "
        f"{time.monotonic() - t1:.0f}s",
        flush=True,
    )
    return time.monotonic() - t1


def compare(url: str, name: str) -> dict[str, Any]:
    """The stored explanation of study ``name`` against the model's truth."""
    definition = load_study_definition(STUDY_FILE)
    space = load_space(definition.resolve(definition.space))
    load = definition.load
    study = load_study(name, open_storage(url, create=False))
    explanation = load_explanation(study)
    estimate = best_estimate(study)
    if explanation is None or estimate is None:
        raise SystemExit(f"study {name}: no explanation stored")
    changes = ChangeSet(space, baseline=space.baseline_params(), winner=estimate.trial.config)

    def truth(config: Any) -> float:
        return true_throughput(space, config, load) or 0.0

    true_winner = truth(changes.winner_config)
    noise = explanation.noise_sd or 0.0
    measured = explanation.winner_measured.mean
    # The servers run the model's closed form with queueing and per-process speeds: their
    # tok/s sit a few percent from it (benchmarks/winner_noise.py calibrate: the bias). A
    # contribution is compared on the measured scale too: the truth x measured / true winner.
    scale = measured.value / true_winner if measured is not None and true_winner else 1.0
    rows = []
    for effect in explanation.effects:
        variant = changes.without(effect.reverted)
        true_without = truth(variant.config) if variant.config is not None else None
        true_delta = None if true_without is None else true_winner - true_without
        est = effect.contribution
        covered = (
            None
            if est is None or est.low is None or est.high is None or true_delta is None
            else est.low <= true_delta <= est.high
        )
        scaled = None if true_delta is None else true_delta * scale
        covered_scaled = (
            None
            if est is None or est.low is None or est.high is None or scaled is None
            else est.low <= scaled <= est.high
        )
        # "Above the noise": the true effect exceeds the interval's half-width (what one
        # could resolve with these repeats), else its sign is not asked of the estimate.
        half = None if est is None or est.high is None else est.high - est.value
        resolvable = true_delta is not None and half is not None and abs(true_delta) > half
        sign_right = (
            None
            if est is None or true_delta is None
            else (est.value > 0) == (true_delta > 0) or not resolvable
        )
        if effect.required and est is None:
            # Explain found the configuration without it failing; the model agrees when it
            # cannot serve it either (a start-up failure, wrong text: true throughput None).
            fails_too = (
                variant.config is not None and true_throughput(space, variant.config, load) is None
            )
            covered = covered_scaled = sign_right = fails_too
            resolvable = True
        rows.append(
            {
                "change": effect.change,
                "reverted": effect.reverted,
                "true": true_delta,
                "estimate": None if est is None else est.value,
                "low": None if est is None else est.low,
                "high": None if est is None else est.high,
                "covered": covered,
                "true_scaled": scaled,
                "covered_scaled": covered_scaled,
                "resolvable": resolvable,
                "sign_right": sign_right,
                "required": effect.required,
            }
        )
    minimal = explanation.minimal
    true_minimal = None
    if minimal is not None:
        true_minimal = truth(changes.variant(minimal.kept).config)
    return {
        "study": name,
        "winner": explanation.winner,
        "changes": len(explanation.effects),
        "runs": explanation.runs,
        "noise_sd": noise,
        "scale": scale,
        "true_winner": true_winner,
        "measured_winner": (
            explanation.winner_measured.mean.value if explanation.winner_measured.mean else None
        ),
        "rows": rows,
        "minimal_kept": minimal.kept if minimal else None,
        "minimal_dropped": minimal.dropped if minimal else None,
        "true_minimal": true_minimal,
        "true_minimal_ratio": (true_minimal / true_winner)
        if true_minimal and true_winner
        else None,
        "measured_minimal_ratio": minimal.ratio.value if minimal and minimal.ratio else None,
    }


def _f(x: float | None, fmt: str = "{:+,.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown(result: dict[str, Any]) -> str:
    out = [
        f"study `{result['study']}`, winner #{result['winner']}: {result['changes']} changes, "
        f"{result['runs']} runs, pooled noise {100 * result['noise_sd']:.1f}%; winner true "
        f"{result['true_winner']:,.1f}, measured {_f(result['measured_winner'], '{:,.1f}')} tok/s "
        f"(scale {result['scale']:.3f})",
        "",
        "| change | true contribution | x scale | estimate [95% interval] | covers true | covers "
        "scaled | above noise | sign |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        est = f"{_f(r['estimate'])} [{_f(r['low'])}, {_f(r['high'])}]"
        if r["required"] and r["estimate"] is None:
            est = "required (fails without it)"
        out.append(
            f"| {r['change']}{' (with ' + r['reverted'][1] + ')' if len(r['reverted']) > 1 else ''}"
            f" | {_f(r['true'])} | {_f(r['true_scaled'])} | {est} | "
            f"{'yes' if r['covered'] else 'NO'} | {'yes' if r['covered_scaled'] else 'NO'} | "
            f"{'yes' if r['resolvable'] else 'no'} | {'right' if r['sign_right'] else 'WRONG'} |"
        )
    rows = result["rows"]
    covered = sum(1 for r in rows if r["covered"])
    covered_scaled = sum(1 for r in rows if r["covered_scaled"])
    resolvable = [r for r in rows if r["resolvable"]]
    signs = sum(1 for r in resolvable if r["sign_right"])
    out += [
        "",
        f"the interval covers the truth for {covered}/{len(rows)} changes, the truth on the "
        f"measured scale for {covered_scaled}/{len(rows)}; sign right "
        f"{signs}/{len(resolvable)} of the changes "
        "whose true effect is above the interval's half-width",
    ]
    if result["minimal_kept"] is not None:
        out.append(
            f"minimal winner: kept {len(result['minimal_kept'])} "
            f"({', '.join(result['minimal_kept'])}), dropped {len(result['minimal_dropped'])}; "
            f"true throughput {_f(result['true_minimal'], '{:,.1f}')} = "
            f"{_f(result['true_minimal_ratio'], '{:.3f}')} of the true winner (measured "
            f"{_f(result['measured_minimal_ratio'], '{:.3f}')})"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--storage", help="compare a stored study instead of running one")
    parser.add_argument("--study", default="dsv4-flash-sim")
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-repeats", type=int, default=6)
    parser.add_argument("--speedup", type=float, help="the servers' clock (the launcher: 8)")
    parser.add_argument(
        "--explain-speedup", type=float, help="the servers' clock while explaining (--speedup)"
    )
    parser.add_argument(
        "--explain-requests",
        type=int,
        help="requests measured per explain run (the study's load: 32); the model's truth is "
        "the steady state, which a 2-round closed loop from a synchronized start falls short of",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    if args.storage:
        results.append(compare(args.storage, args.study))
    else:
        settings = ExplainSettings(repeats=args.repeats, max_repeats=args.max_repeats)
        tmp = Path(tempfile.mkdtemp(prefix="explain-truth-"))
        study_file = STUDY_FILE if args.speedup is None else with_speedup(args.speedup, tmp)
        explain_file = study_file
        if args.explain_speedup is not None:
            (tmp / "explain").mkdir()
            explain_file = with_speedup(args.explain_speedup, tmp / "explain")
        for seed in args.seeds:
            url = f"sqlite:///{tmp}/explain-{seed}.db"
            name = f"explain-truth-{seed}"
            seconds = run_study(
                url,
                name,
                trials=args.trials,
                seed=seed,
                settings=settings,
                study_file=study_file,
                explain_file=explain_file,
                explain_requests=args.explain_requests,
            )
            result = compare(url, name)
            result["explain_seconds"] = seconds
            result["speedup"] = args.speedup or 8
            result["explain_speedup"] = args.explain_speedup or args.speedup or 8
            result["explain_requests"] = args.explain_requests
            results.append(result)
            print(markdown(result), "\n", flush=True)
    if args.storage:
        print(markdown(results[0]))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
