"""What ``autotune explain`` stored in a tuning study, as BENCHMARKS.md's table: each change
of the winner, the winner measured without it and what it bought, and how the runs it borrowed
read against its own. Read by ``benchmarks/h200_side_by_side.py`` under its verdict.

Where the runs (its own and the borrowed) span GPUs, a last column reads each change with the
GPU as a block (:func:`autotune.explain.gpu_blocked`): the explanation keeps runs of GPUs
that read within the noise of each other, and a few percent between GPUs that is within it
still moves a small change's contribution by as much (the dense winner's on two H100s)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from autotune.explain import gpu_blocked
from autotune.explain.occasions import describe
from autotune.explain.record import Effect, Measured, load_explanation, load_runs


def load_study(path: Path, name: str) -> optuna.Study | None:
    """Study ``name`` of the SQLite file ``path``; None where the file is not there (an arm
    not run yet)."""
    if not path.is_file():
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{path}")


def _measured(m: Measured) -> str:
    if m.mean is None:
        return f"failed: {m.failure}" if m.failure else "not measured"
    return f"{m.mean.value:,.1f} (n={m.n})"


def _value(config: Mapping[str, Any], lever: str) -> str:
    value = config.get(lever)
    return "default" if value is None else str(value)


def _change(x: Effect) -> str:
    moved = ", ".join(
        f"{lever}: {_value(x.baseline, lever)} -> {_value(x.winner, lever)}" for lever in x.levers
    )
    return moved + (" (required)" if x.required else "")


def explanation_lines(db: Path, name: str) -> list[str]:
    """What ``autotune explain`` stored in the tuning study: each change of the winner, the
    winner measured without it and what it bought, with the 95% interval; how the runs it
    borrowed read against its own (:func:`autotune.explain.occasions.describe`). Nothing
    before it ran."""
    study = load_study(db, name)
    e = None if study is None else load_explanation(study)
    if e is None:
        return []
    assert study is not None
    fit = gpu_blocked(e, load_runs(study))
    lent = f" + {e.borrowed} borrowed" if e.borrowed else ""
    if e.borrowed_own:
        lent += f" ({e.borrowed_own} from the study's own trials)"
    noise = "" if e.noise_sd is None else f"; run-to-run noise {100 * e.noise_sd:.1f}%"
    out = [
        f"What the winner's changes bought (`autotune explain` of #{e.winner}: "
        f"{e.runs} restarts{lent}"
        + ("" if e.complete else f"; incomplete: {e.stopped or 'not finished'}")
        + f"): the winner {_measured(e.winner_measured)}, vLLM's defaults "
        f"{_measured(e.baseline_measured)}{noise}.",
        "",
        f"| change | the winner without it, {e.unit} | what it bought (95% CI) | share |"
        + (" share, the GPU as a block (95% CI) |" if fit else ""),
        "|---|---|---|---|" + ("---|" if fit else ""),
    ]
    for x in sorted(e.effects, key=lambda x: -(x.contribution.value if x.contribution else 0)):
        c = x.contribution
        bought = "-" if c is None else f"{c.value:+,.1f}"
        if c is not None and c.low is not None and c.high is not None:
            bought += f" ({c.low:+,.1f} to {c.high:+,.1f})"
        share = "-" if x.relative is None else f"{100 * x.relative:+.1f}%"
        row = f"| {_change(x)} | {_measured(x.without)} | {bought} | {share} |"
        if fit:
            row += f" {fit.share_text(x.change)} |"
        out.append(row)
    tail = ["", *(f"* {describe(o)}" for o in e.occasions)]
    if fit:
        tail.append(f"* {fit.describe()}")
    return out + tail
