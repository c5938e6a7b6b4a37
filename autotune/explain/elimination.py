"""The minimal winner's search: backward elimination, after one attempt to drop together
every change the ablation measured as negligible.

Why the attempt: on hardware a winner often carries several changes that buy nothing
measurable (the sampler set them, nothing held them back). One at a time, each is a close
call at run-to-run noise about the size of the tolerance, and a close call takes the
candidate and the winner up to ``max_repeats`` runs: on the H200's 7B winner (five such
changes, 3% noise and tolerance) that is about 20 restarts, more than the ablation itself
(``benchmarks/explain_borrow.py``). The negligible ones are those the ablation could not
tell from nothing (the winner without it alone at least ``1 - tolerance`` of the winner, and
the ratio's 95% interval reaching 1; a choice, not a verdict: the attempt itself is the
test): the winner without all of them is measured like any candidate
and judged by the same rule (its lower 95% bound within ``tolerance`` of the winner's). Kept
within, they are dropped in one decision each, frozen together; otherwise the attempt is
recorded as failed and the elimination goes one change at a time, as if it had not been
made (its runs stay: a configuration measured serves any later step). With fewer than two
negligible changes there is nothing to gain and no attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.explain.changes import Variant
from autotune.explain.record import Decision, ExplainState
from autotune.explain.steps import Decide, Finished, Measure, Runs, RunStats, Step
from autotune.results import conservative, half_width

if TYPE_CHECKING:
    from autotune.explain.planner import Planner


def negligible(p: Planner, runs: Runs, order: Sequence[str]) -> list[str]:
    """The changes (in elimination order) the ablation could not tell from nothing: the
    winner without it alone measured at least ``1 - tolerance`` of the winner, and the
    ratio's 95% interval reaches 1. The group :func:`eliminate` first tries to drop."""
    w = p.stats(runs, p.winner.key)
    if w.n == 0 or w.mean <= 0:
        return []
    sd, df = p.noise(runs)
    floor = 1.0 - p.settings.tolerance
    out = []
    for name in order:
        alone = p.stats(runs, p.reverts[name][0].key)
        if not alone.n or alone.dead or alone.breaks_slo:
            continue
        ratio = p.ratio(alone, w, sd, df)
        if ratio is None or ratio.value < floor:
            continue
        if ratio.high is None or ratio.high >= 1.0:
            out.append(name)
    return out


def eliminate(p: Planner, runs: Runs, state: ExplainState) -> Step:
    """The next step of the minimal-winner search (module doc)."""
    s = p.settings
    w = p.stats(runs, p.winner.key)
    if w.dead:  # nothing to stay within: every removal would pass against a bound of 0
        return Finished(
            f"the winner fails from fresh services ({w.failure}): no minimal winner",
            complete=False,
        )
    order = p.elimination_order(state)
    if s.drop_together and state.together is None:
        group = negligible(p, runs, order)
        why = (
            f"trying first to drop together {', '.join(group)} (the ablation could not tell "
            "any of them from nothing)"
            if len(group) >= 2
            else "fewer than two negligible changes: one at a time"
        )
        return Decide(state.model_copy(update={"together": group}), why)
    decided = {d.change for d in state.decisions}
    together = state.together or []
    if len(together) >= 2 and state.together_dropped is None and not decided & set(together):
        return _together(p, runs, state, together, w)
    todo = [n for n in order if n not in decided]
    if not todo:
        return Finished("done")
    return _one(p, runs, state, todo[0], w)


def _together(p: Planner, runs: Runs, state: ExplainState, group: list[str], w: RunStats) -> Step:
    kept = p.kept(state)
    candidate = p.changes.variant(n for n in kept if n not in group)
    names = ", ".join(group)

    def verdict(dropped: bool, why: str) -> Decide:
        update: dict[str, object] = {"together_dropped": dropped}
        if dropped:
            update["decisions"] = [
                *state.decisions,
                *(
                    Decision(change=n, action="dropped", why=f"together ({names}): {why}",
                             key=candidate.key)
                    for n in group
                ),
            ]  # fmt: skip
        return Decide(
            state.model_copy(update=update),
            f"{'dropped' if dropped else 'not dropped'} together: {names}: {why}"
            + ("" if dropped else "; one at a time"),
        )

    if candidate.config is None:
        return verdict(False, f"the configuration without them is refused: {candidate.refused}")
    step = _judge(p, runs, candidate, w, "them")
    if isinstance(step, Measure):
        return step
    action, why = step
    return verdict(action == "dropped", why)


def _one(p: Planner, runs: Runs, state: ExplainState, name: str, w: RunStats) -> Step:
    s = p.settings
    kept = p.kept(state)
    candidate = p.changes.variant(n for n in kept if n != name)

    def decide(action: str, why: str) -> Decide:
        decision = Decision(change=name, action=action, why=why, key=candidate.key)  # type: ignore[arg-type]
        return Decide(
            state.model_copy(update={"decisions": [*state.decisions, decision]}),
            f"{action} {name}: {why}",
        )

    if candidate.config is None:
        return decide("kept", f"the configuration without it is refused: {candidate.refused}")
    alone = p.stats(runs, p.reverts[name][0].key)
    if alone.dead:  # not worth a restart: the winner without it did not even start
        return decide("kept", f"the winner without it fails ({alone.failure})")
    sd, df = p.noise(runs)
    target = 1.0 - s.tolerance
    if candidate.key != p.reverts[name][0].key:
        # The ablation measured the winner without it alone: far below the tolerance with
        # confidence, it is kept without restarts (each costs minutes on hardware).
        alone_ratio = p.ratio(alone, w, sd, df)
        if alone_ratio is not None and alone_ratio.high is not None and alone_ratio.high < target:
            return decide(
                "kept",
                f"the winner without it alone measured {alone.mean:,.1f} (n={alone.n}), "
                f"{alone_ratio.value:.3f} of the winner [{alone_ratio.low:.3f}, "
                f"{alone_ratio.high:.3f}]: below {100 * target:g}% with confidence, not "
                "measured again",
            )
    step = _judge(p, runs, candidate, w, "it")
    if isinstance(step, Measure):
        return step
    return decide(*step)


def _judge(
    p: Planner, runs: Runs, candidate: Variant, w: RunStats, it: str
) -> Measure | tuple[str, str]:
    """Measure ``candidate`` (the current set without ``it``) once more, or the verdict:
    ``("dropped" | "kept", why)``. A close call (the ratio's interval straddles ``1 -
    tolerance``) takes more runs of the candidate and, to stay balanced, of the winner, up to
    ``max_repeats``."""
    s = p.settings
    c = p.stats(runs, candidate.key)
    if not c.dead and c.n < s.repeats:
        return p.measure(candidate, "minimal", runs)
    if c.dead:
        return ("kept", f"without {it} the deployment fails ({c.failure})")
    if c.breaks_slo:
        return ("kept", f"without {it} {c.infeasible} of {c.n} runs break an SLO")
    sd, df = p.noise(runs)
    target = 1.0 - s.tolerance
    ratio = p.ratio(c, w, sd, df)
    if ratio is not None and ratio.low is not None and ratio.high is not None:
        close = ratio.low < target < ratio.high
        if close and c.n < s.max_repeats:
            if w.n <= c.n and w.n < 2 * s.max_repeats:
                return p.measure(p.winner, "minimal", runs)
            return p.measure(candidate, "minimal", runs)
    low_c = conservative(c.mean, half_width(c.mean, c.n, sd, df))
    low_w = conservative(w.mean, half_width(w.mean, w.n, sd, df))
    shown = f"{c.mean:,.1f} (n={c.n}, lower bound {low_c:,.1f})"
    if low_c >= target * low_w:
        return (
            "dropped",
            f"without {it} {shown}, within {100 * s.tolerance:g}% of the winner's lower "
            f"bound {low_w:,.1f}",
        )
    return (
        "kept",
        f"without {it} {shown}, below {100 * target:g}% of the winner's lower bound {low_w:,.1f}",
    )
