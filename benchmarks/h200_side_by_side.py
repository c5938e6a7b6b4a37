"""Issue 28's side-by-side on one Hopper GPU, read back from the stored results: a study named
*-h100-* ran on an H100 (benchmarks/h100/), every other on the H200 (benchmarks/h200/).

    .venv/bin/python benchmarks/h200_side_by_side.py                  # the dense 7B model
    .venv/bin/python benchmarks/h200_side_by_side.py --study vllm-h100-moe --budget 16

Prints BENCHMARKS.md's table, one row per arm: server restarts spent, the best configuration
(levers changed from vLLM's defaults), its output tok/s (mean of its measurements, n), J/token
where NVML telemetry exists, and the gain over vLLM's defaults; then, once the check study has
measured the winner, issue 28's done criterion arm by arm (:func:`verdict`); and, once
``autotune explain`` ran on the tuning study, what each of the winner's changes bought
(:func:`explanation_lines`); where its runs span GPUs, each comparison also on the GPU that
measured most of both and with the GPU as a block (:mod:`benchmarks.gpu_gain`); and, for the
dense study, its check measured on an H100 (:func:`cross_card_lines`). What it reads, for
STUDY:

* ``STUDY.db``: autotune's default sampler (TPE), ``studies/STUDY.yaml``, and the
  explanation of its winner stored in it;
* ``STUDY-random.db``: random search, ``studies/STUDY-random.yaml``;
* ``STUDY-side-by-side.tar.gz``: ``scripts/h200/run.sh sweep`` (and ``agreement``)'s directory,
  as ``collect`` returned it: ``vllm bench sweep serve``'s results and log;
* ``STUDY-check.db``: vLLM's defaults, the hand-picked combination and autotune's winner, each
  from three fresh starts (``scripts/h200/run.sh check``).

Restarts are counted as the side-by-side harness counts them (``benchmarks/side_by_side``,
``autotune_counts``): a trial that launched a server (finished, refused at start, aborted
early, cut by an interruption) and every re-measurement; a reused duplicate or a forbidden
proposal starts nothing. The sweep's are its ``[BEGIN SERVER]`` lines. An arm not stored yet
reads "not run yet". This script only reads, so every figure can be checked without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from autotune.results import (  # noqa: E402
    ConfigEstimate,
    config_estimates,
    study_cards,
    winner_candidates,
)
from autotune.space import load_space  # noqa: E402
from autotune.study.definition import load_study_definition  # noqa: E402
from autotune.telemetry import short_machine  # noqa: E402
from benchmarks.explanation_table import explanation_lines, load_study  # noqa: E402
from benchmarks.gpu_gain import gain, gpu_adjusted, on_one_gpu  # noqa: E402
from benchmarks.side_by_side.arm_autotune import autotune_counts  # noqa: E402
from benchmarks.side_by_side.arm_sweep import combo_key, sweep_state  # noqa: E402

HERE = REPO / "benchmarks" / "h200"
VLLM_DEFAULTS_H200 = (1024, 8192)
"""vLLM 0.26.0's max_num_seqs and max_num_batched_tokens for the API server on a GPU of at
least 70 GiB (engine/arg_utils.py, get_batch_defaults), the H200 and the H100 80GB alike: a
point of the sweep's grid."""


def card_of(study: str) -> tuple[str, Path]:
    """The GPU a study ran on and where its results are kept (scripts/h200/run.sh: CARD,
    RESULTS): the H100 for a study named *-h100-*, else the H200."""
    if "-h100-" in study:
        return "H100", REPO / "benchmarks" / "h100"
    return "H200", HERE


NOT_RUN = "not run yet"


@dataclass
class Row:
    arm: str
    restarts: str = "-"
    config: str = "-"
    tok_s: str = NOT_RUN
    j_per_token: str = "-"
    gain: str = "-"
    values: list[float] = field(default_factory=list)
    note: str = ""
    gpus: list[str | None] = field(default_factory=list)
    """The GPU (NVML UUID) each of ``values`` was measured on, None where not recorded."""
    trial: int | None = None
    """A tuning arm's winner: its trial number in that arm's study."""

    def line(self) -> str:
        cells = [self.arm, self.restarts, self.config, self.tok_s, self.j_per_token, self.gain]
        return "| " + " | ".join(cells) + " |"


def _baseline_params(study_name: str) -> dict[str, Any]:
    definition = load_study_definition(REPO / "studies" / f"{study_name}.yaml")
    return dict(load_space(definition.resolve(definition.space)).baseline_params())


def changed_levers(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    changed = {k: v for k, v in sorted(params.items()) if baseline.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "vLLM's defaults"


def _telemetry(study: optuna.Study, m: Any) -> dict[str, Any]:
    """The NVML telemetry stored with measurement ``m`` (its trial's, or its
    re-measurement's), ``{}`` where none was."""
    if m.repeat == 0:
        telemetry = study.trials[m.of].user_attrs.get("telemetry")
    else:
        telemetry = study.user_attrs.get(f"remeasure:{m.of}:{m.repeat}", {}).get("telemetry")
    return telemetry or {}


def energy_per_token(study: optuna.Study, est: ConfigEstimate) -> list[float]:
    """J/token of each full measurement of ``est`` that has NVML telemetry."""
    out = []
    for m in est.measurements:
        if not m.full:
            continue
        value = _telemetry(study, m).get("energy_per_token_j")
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.append(float(value))
    return out


def _values(est: ConfigEstimate) -> list[float]:
    return [m.throughput for m in est.measurements if m.full and m.throughput is not None]


def _gpus(est: ConfigEstimate) -> list[str | None]:
    """The GPUs (:attr:`autotune.results.Measurement.machine`) of :func:`_values`'
    measurements, in order."""
    return [m.machine for m in est.measurements if m.full and m.throughput is not None]


def same_gpu(a: Row, b: Row) -> str:
    """Whether ``a``'s and ``b``'s runs shared a GPU (a device session lends a new one nearly
    every time, and two of a kind served vLLM's defaults 17% apart): one GPU for all, or
    the gain on the GPU that measured most of both and the gain over every run with the GPU
    as a block (:mod:`benchmarks.gpu_gain`), or none shared. Runs without a recorded GPU
    are taken as one session's."""
    gpus_a, gpus_b = set(a.gpus), set(b.gpus)
    if None in gpus_a | gpus_b or len(gpus_a | gpus_b) <= 1:
        return "side by side, one session"
    one = on_one_gpu(a.values, a.gpus, b.values, b.gpus)
    if one is None:
        return "not side by side (no GPU measured both)"
    gpu, va, vb = one
    return (
        f"not all side by side (on {len(gpus_a | gpus_b)} GPUs); on {short_machine(gpu)} alone "
        f"(n={len(va)} vs {len(vb)}): {gain(va, vb)}; the GPU as a block: "
        f"{gpu_adjusted(a.values, a.gpus, b.values, b.gpus)}"
    )


def fmt_tok(values: Sequence[float]) -> str:
    if not values:
        return "-"
    runs = ", ".join(f"{v:,.1f}" for v in values)
    return f"{statistics.fmean(values):,.1f} (n={len(values)}: {runs})"


def fmt_j(values: Sequence[float]) -> str:
    if not values:
        return "-"
    n = f" (n={len(values)})" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.3f}{n}"


def restarts_of(storage: Path, name: str) -> tuple[int, dict[str, Any]]:
    counts = autotune_counts(f"sqlite:///{storage}", name)
    return counts["launched"] + len(counts["remeasurements"]), counts


def tuning_row(label: str, db: Path, name: str, budget: int) -> tuple[Row, list[float]]:
    """A tuning arm's row; also the baseline's measurements (vLLM's defaults in that study)."""
    study = load_study(db, name)
    if study is None:
        return Row(label), []
    restarts, counts = restarts_of(db, name)
    spent = (
        f"{restarts} ({counts['launched']} trials + {len(counts['remeasurements'])} re-measured)"
    )
    if restarts < budget or counts["running"]:
        running = ", 1 running at the snapshot" if counts["running"] else ""
        spent += f"; in progress: {restarts} of {budget}{running}"
    estimates = config_estimates(study)
    cards = study_cards(study, estimates)  # a study resumed on whatever card a lease gave
    if len(cards) > 1:
        kinds = (f"{card.removeprefix('NVIDIA ')} ({n})" for card, n in cards.items())
        spent += "; on " + ", ".join(kinds)
    base = next((e for e in estimates if e.trial.is_baseline), None)
    ranked = winner_candidates(study, estimates)
    est = ranked[0] if ranked else None  # best_estimate's pick
    row = Row(label, restarts=spent)
    if est is not None:
        row.values, row.trial = _values(est), est.trial.number
        row.config = f"#{est.trial.number}: " + changed_levers(
            est.trial.params, _baseline_params(name)
        )
        row.tok_s = fmt_tok(row.values)
        row.j_per_token = fmt_j(energy_per_token(study, est))
    return row, _values(base) if base is not None else []


def read_side_dir(tar: Path, out: Path) -> Path | None:
    """The side-by-side directory from run.sh's tarball, unpacked into ``out``; or None."""
    if not tar.is_file():
        return None
    with tarfile.open(tar) as t:
        t.extractall(out, filter="data")
    return out


def sweep_row(side: Path | None, defaults: Sequence[float]) -> Row:
    label = "`vllm bench sweep serve` (max_num_seqs x max_num_batched_tokens)"
    if side is None or not (side / "sweep").is_dir():
        return Row(label)
    state = sweep_state(side / "sweep")
    grid, rows = state["grid"], state["combinations"]
    done = len(grid) - len(state["pending"]) - len(state["failed"])
    spent = f"{state['restarts']} ({done} of {len(grid)} combinations done"
    spent += f", {len(state['failed'])} failed" if state["failed"] else ""
    # Points of other sittings never ran side by side (arm_sweep.sittings).
    spent += f"; in {state['sittings']} sittings)" if state["sittings"] > 1 else ")"
    row = Row(label, restarts=spent)
    best = state["best"]
    if best is None:
        row.tok_s = "no run finished yet"
        return row
    row.values = [r["output_throughput"] for r in best["runs"] if r["output_throughput"]]
    defaults_point = next((r for r in rows if combo_key(r) == VLLM_DEFAULTS_H200), None)
    mark = " (= vLLM's defaults)" if combo_key(best) == VLLM_DEFAULTS_H200 else ""
    row.config = (
        f"max_num_seqs={best['max_num_seqs']}, "
        f"max_num_batched_tokens={best['max_num_batched_tokens']}{mark}"
    )
    row.tok_s = fmt_tok(row.values) + " by `vllm bench serve`"
    if defaults_point is not None:
        own = [r["output_throughput"] for r in defaults_point["runs"] if r["output_throughput"]]
        row.gain = gain(row.values, own) + " over its own 1024 x 8192 point"
    else:
        row.gain = gain(row.values, defaults) + " (another client)"
    return row


def _label(study: optuna.Study, number: int) -> str:
    """A queued configuration's name; a retry (the machine went back mid-trial) is named by the
    trial it retried: studies measured before the retry carried the name had none of their own."""
    attrs = study.trials[number].user_attrs
    while "label" not in attrs and "retry_of" in attrs:
        attrs = study.trials[int(attrs["retry_of"])].user_attrs
    return str(attrs.get("label") or "?")


def queued_arm(tag: str) -> str:
    """The check study's row of a configuration queued with ``--also`` ("#19 of STUDY")."""
    return f"{tag}, from fresh starts"


def check_rows(db: Path, name: str, defaults: list[float]) -> list[Row]:
    """Defaults x3, hand-picked and the winner re-measured, from the check study."""
    labels = ("vLLM defaults, 3 fresh starts", "hand-picked (DOMAIN.md §8b)", "winner re-measured")
    study = load_study(db, name)
    if study is None:
        return [Row(label) for label in labels]
    baseline = _baseline_params(name)
    by_label: dict[str, ConfigEstimate] = {}
    for est in config_estimates(study):
        label = "default" if est.trial.is_baseline else _label(study, est.trial.number)
        by_label[label] = est
    counts = autotune_counts(f"sqlite:///{db}", name)
    remeasured: dict[int, int] = {}
    for m in counts["remeasurements"]:
        remeasured[m["of"]] = remeasured.get(m["of"], 0) + 1

    def row(label: str, est: ConfigEstimate) -> Row:
        values = _values(est)
        return Row(
            label,
            restarts=str(1 + remeasured.get(est.trial.number, 0)),
            config=changed_levers(est.trial.params, baseline),
            tok_s=fmt_tok(values),
            j_per_token=fmt_j(energy_per_token(study, est)),
            values=values,
            gpus=_gpus(est),
        )

    rows = []
    for label, key in zip(labels, ("default", "hand-picked", "winner"), strict=True):
        tag, found = next(((k, e) for k, e in by_label.items() if k.startswith(key)), ("", None))
        if found is None:
            rows.append(Row(label, tok_s="not measured yet"))
            continue
        rows.append(row(f"{label} ({tag})" if key == "winner" else label, found))
        if key != "default":
            rows[-1].gain = gain(rows[-1].values, defaults)
    # Configurations of the tuning study queued later (`side_by_side.py --also N`): one the
    # tuning study could not judge, measured here from fresh starts without an abort.
    rows += [row(queued_arm(tag), e) for tag, e in by_label.items() if tag[:1] == "#"]
    return rows


def agreement_row(side: Path | None) -> Row:
    label = "winner, one fresh start, `vllm bench serve` vs autotune's client"
    results = side / "results.json" if side is not None else None
    if results is None or not results.is_file():
        return Row(label)
    g = json.loads(results.read_text()).get("agreement")
    if not g:
        return Row(label)
    v = [r["output_throughput"] for r in g["runs"] if r["tool"] == "vllm bench serve"]
    a = [r["output_throughput"] for r in g["runs"] if r["tool"] == "autotune loadgen"]
    return Row(
        label,
        restarts=str(g.get("restarts", 1)),
        config=f"#{g['winner_trial']}",
        tok_s=f"{fmt_tok(v)} vs {fmt_tok(a)}",
        gain=f"vllm bench serve {100 * g['rel_diff']:+.1f}% vs autotune's client",
        values=v,  # by `vllm bench serve`: what the sweep's row is measured with
    )


def verdict(
    *,
    winner: Row,
    defaults: Row,
    hand: Row,
    random: Row,
    sweep: Row,
    agreement: Row,
    random_check: Row | None = None,
) -> list[str]:
    """Issue 28's done criterion, one line per arm: the winner re-measured from fresh starts
    against the defaults, the hand-picked combination, random search's and the sweep's best,
    each saying whether the two sides ran side by side (a gain across sessions or machines
    carries their drift: on the H100 the defaults differed by 17% between machines). Random
    search's best is taken from the check study where it was measured there from fresh
    starts (``random_check``, queued with ``--also STUDY:best``): its tuning study's runs
    passed its own selection, a winner's curse the fresh starts do not carry. The sweep's
    best is compared by its own client, `vllm bench serve`, with the agreement run's
    measurement of the winner; without one, with autotune's figure of it."""
    if not winner.values:
        return []
    other = "not side by side"
    by_vllm = (agreement.values, "`vllm bench serve` on both sides")
    by_ours = (winner.values, "autotune's client against `vllm bench serve`")
    sweep_values, client = by_vllm if agreement.values else by_ours
    pairs = [
        (
            "vLLM's defaults (3 fresh starts)",
            defaults.values,
            winner.values,
            same_gpu(winner, defaults),
        ),
        ("the hand-picked combination", hand.values, winner.values, same_gpu(winner, hand)),
        (
            (
                f"random search's best ({random.config}), from fresh starts in the check study",
                random_check.values,
                winner.values,
                same_gpu(winner, random_check),
            )
            if random_check is not None and random_check.values
            else (f"random search's best ({random.config})", random.values, winner.values, other)
        ),
        (f"the sweep's best ({sweep.config})", sweep.values, sweep_values, f"{client}, {other}"),
    ]
    out = [f"The {winner.arm} against each arm:"]
    for name, reference, values, where in pairs:
        if reference:
            out.append(f"* {name}: {gain(values, reference)}; {where}")
        else:
            out.append(f"* {name}: {NOT_RUN}")
    return out


CROSS_CARD = {
    "vllm-h200-dense": (
        "H100",
        REPO / "benchmarks" / "h100" / "vllm-dense-check-h100.db",
        REPO / "benchmarks" / "h100" / "vllm-h200-dense-explain-h100.db",
    )
}
"""A tuning study's check (and explanation) measured on another card than its own: the dense
H200 winner taken to an H100 untuned (BENCHMARKS.md "The same check on an H100"); the
explanation is a copy of the tuning study's database with ``autotune explain`` run there."""


def cross_card_lines(study: str) -> list[str]:
    """The check study of ``study`` measured on another card (:data:`CROSS_CARD`): defaults,
    hand-picked and the winner from fresh starts there, the winner against the other two
    (:func:`same_gpu`: its runs came from two sessions), and the explanation of the winner
    measured on that card, as far as it went. Nothing where none was stored."""
    card, db, explained = CROSS_CARD.get(study, ("", Path(), Path()))
    if not db.is_file():
        return []
    rows = check_rows(db, f"{study}-check", [])
    defaults, hand, winner = rows[:3]
    for row in (hand, winner):
        row.gain = gain(row.values, defaults.values)
    pairs = [("vLLM's defaults", defaults), ("the hand-picked combination", hand)]
    return [
        f"## {study}'s winner on an {card}, untuned there "
        f"(`{db.relative_to(REPO)}`: fresh starts, its GPUs {_gpu_list(rows[:3])})",
        "",
        "| configuration | restarts | levers changed from vLLM's defaults "
        "| output tok/s, mean (n: runs) | J/token | vs defaults |",
        "|---|---|---|---|---|---|",
        *(r.line() for r in rows[:3]),
        "",
        f"The {winner.arm} on the {card} against:",
        *(
            f"* {name}: {gain(winner.values, row.values)}; {same_gpu(winner, row)}"
            for name, row in pairs
            if row.values and winner.values
        ),
        *(["", *lines] if (lines := explanation_lines(explained, study)) else []),
    ]


def _gpu_list(rows: Sequence[Row]) -> str:
    gpus = sorted({g for r in rows for g in r.gpus if g is not None})
    return ", ".join(short_machine(g) for g in gpus) or "not recorded"


def report(study: str, budget: int, *, here: Path | None = None) -> list[str]:
    card, stored = card_of(study)
    here = stored if here is None else here
    tpe, tpe_base = tuning_row(
        f"autotune, TPE (`studies/{study}.yaml`)", here / f"{study}.db", study, budget
    )
    rnd, rnd_base = tuning_row(
        f"random search (`studies/{study}-random.yaml`)",
        here / f"{study}-random.db",
        f"{study}-random",
        budget,
    )
    check = check_rows(here / f"{study}-check.db", f"{study}-check", [])
    defaults = check[0].values
    source = "the check study's defaults, 3 fresh starts"
    if not defaults:
        defaults = tpe_base + rnd_base
        source = f"the tuning studies' baselines (n={len(defaults)}): check study not run yet"
    for row in (tpe, rnd, *check[1:]):
        if row.values:
            row.gain = gain(row.values, defaults)
    with tempfile.TemporaryDirectory(prefix="h200-side-") as tmp:
        side = read_side_dir(here / f"{study}-side-by-side.tar.gz", Path(tmp))
        sweep, agreement = sweep_row(side, defaults), agreement_row(side)
    rows = [tpe, rnd, sweep, *check, agreement]
    out = [
        f"## {study}: side by side on one {card} (budget {budget} restarts per tuning arm)",
        "",
        f"Gain over vLLM's defaults: against {source}"
        + (f", {statistics.fmean(defaults):,.1f} tok/s." if defaults else "."),
        "",
        "| arm | restarts | best configuration (levers changed from vLLM's defaults) "
        "| output tok/s, mean (n: runs) | J/token | vs defaults |",
        "|---|---|---|---|---|---|",
        *(r.line() for r in rows),
    ]
    queued = queued_arm(f"#{rnd.trial} of {study}-random")
    random_check = next((r for r in check[3:] if r.arm == queued), None)
    lines = verdict(
        winner=check[2], defaults=check[0], hand=check[1], random=rnd, sweep=sweep,
        agreement=agreement, random_check=random_check,
    )  # fmt: skip
    explained = explanation_lines(here / f"{study}.db", study)
    cross = cross_card_lines(study) if here == stored else []
    return out + [
        *(["", *lines] if lines else []),
        *(["", *explained] if explained else []),
        *(["", *cross] if cross else []),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="vllm-h200-dense", help="the tuning study's name")
    ap.add_argument("--budget", type=int, default=20, help="restarts per tuning arm")
    args = ap.parse_args(argv)
    print("\n".join(report(args.study, args.budget)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
