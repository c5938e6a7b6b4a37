"""Do borrowed runs agree with the explanation's own? The drift between occasions.

Why: a borrowed run (:mod:`autotune.explain.borrowed`) was measured on another occasion:
another machine of the same kind, another hour. On the H100s that served issue 28, vLLM's
defaults ran 17% apart between two sessions, more than most levers buy. A contribution
computed from a borrowed configuration against one the explanation measured itself carries
that difference as if a change had bought it. Where a configuration holds runs of both
kinds, the two means tell the difference directly; pooled over the configurations that
do, per source study, they give one ratio with a 95% interval (log scale, from the
run-to-run noise within each occasion: runs of one configuration grouped by where they were
measured, so the drift itself does not widen the interval that should show it). An
interval that excludes 1 says the occasions differ: the planner leaves that study's runs
out, frozen in the state, and measures what they stood for (:meth:`Planner.next`); the
explanation lists the study as left out.

An explanation's own runs can span occasions too: on hardware lent a session at a time it
resumes on another machine (issue 28's GPUs: a new one nearly every session, and two H100s
ran vLLM's defaults 17% apart). :func:`by_occasion` marks the runs measured on an earlier
machine (their GPUs' NVML UUIDs) as that machine's occasion, so the same comparison, the
anchor run and the leaving out apply to them as to a lending study's. The current machine is
the one of the latest run; on a machine without GPU telemetry (the twin, a CPU) every run
is one occasion, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from autotune.explain.record import ExplainRun, Interval, Occasion
from autotune.results import noise_level, t_quantile
from autotune.telemetry import short_machine


def source_study(source: str) -> str:
    """The study of a borrowed run's origin (``STUDY#N``, ``STUDY#N/R``)."""
    return source.rpartition("#")[0]


MACHINE_PREFIX = "(this explanation on "
"""How an earlier machine's occasion is named (in ``ExplainState.left_out`` and
``Occasion.study``): no study file can name a study so (its ``study:`` pattern refuses
parentheses)."""


def machine_occasion(machine: str) -> str:
    """The occasion's name for the GPUs ``machine`` (comma-joined NVML UUIDs), each by
    :func:`~autotune.telemetry.short_machine`."""
    return f"{MACHINE_PREFIX}{short_machine(machine)})"


def current_machine(runs: Mapping[str, Sequence[ExplainRun]]) -> str | None:
    """The machine of this explanation's latest run: by ``measured_at`` (untimed runs come
    before timed ones), among untimed ones the machine holding most runs."""
    own = [r for rs in runs.values() for r in rs if r.source is None and r.machine is not None]
    if not own:
        return None
    timed = [r for r in own if r.measured_at is not None]
    if timed:
        return max(timed, key=lambda r: r.measured_at or 0.0).machine
    counts: dict[str, int] = {}
    for r in own:
        counts[r.machine or ""] = counts.get(r.machine or "", 0) + 1
    return max(sorted(counts), key=lambda m: counts[m])


def by_occasion(runs: Mapping[str, Sequence[ExplainRun]]) -> dict[str, list[ExplainRun]]:
    """``runs`` with this explanation's own runs on an earlier machine given that machine's
    occasion as their source (``(this explanation on GPU-...)#KEY/I``): from here on they
    are read like a lending study's (module doc). Unchanged where every own run was
    measured on one machine, or on none that NVML saw."""
    here = current_machine(runs)
    out: dict[str, list[ExplainRun]] = {}
    for key, rs in runs.items():
        out[key] = [
            r.model_copy(update={"source": f"{machine_occasion(m)}#{key}/{r.index}"})
            if r.source is None and here is not None and (m := r.machine) not in (None, here)
            else r
            for r in rs
        ]
    return out


def borrowed(run: ExplainRun) -> bool:
    """Whether ``run`` was lent by a study (not measured here, on this machine or an earlier
    one)."""
    return run.source is not None and not run.source.startswith(MACHINE_PREFIX)


def lent_by(run: ExplainRun, study: str) -> bool:
    """Whether ``run`` was lent by ``study`` (compared whole: a prefix test would take
    ``a#b``'s runs for ``a``'s)."""
    return run.source is not None and source_study(run.source) == study


def within_noise(runs: Mapping[str, Sequence[ExplainRun]]) -> tuple[float | None, int]:
    """The relative run-to-run noise pooled over runs of one configuration measured on one
    occasion (the explanation's own, or one lending study's)."""
    groups: dict[tuple[str, str | None], list[float]] = {}
    for key, rs in runs.items():
        for r in rs:
            if (v := r.value) is not None:
                origin = None if r.source is None else source_study(r.source)
                groups.setdefault((key, origin), []).append(v)
    return noise_level(list(groups.values()))


def occasions(
    runs: Mapping[str, Sequence[ExplainRun]],
    prior: tuple[float | None, int] = (None, 0),
    *,
    left_out: Sequence[str] = (),
) -> list[Occasion]:
    """Per study lending runs (in name order): the mean of its runs over the mean of the
    explanation's own, per configuration holding both, pooled over those configurations
    (geometric mean), with a 95% interval from :func:`within_noise` (until a configuration
    was run twice on one occasion, ``prior``: the tuning study's relative noise and its
    degrees of freedom, never a figure pooled across occasions, which the drift itself
    would widen); studies sharing no
    configuration with the explanation's own runs are listed with ``configurations=0`` and
    no ratio; ``left_out``: the studies the planner no longer reads."""
    sd, df = within_noise(runs)
    if sd is None:
        sd, df = prior
    logs: dict[str, list[tuple[float, float]]] = {}
    lent: set[str] = set()
    for rs in runs.values():
        own = [v for r in rs if r.source is None and (v := r.value) is not None and v > 0]
        by_study: dict[str, list[float]] = {}
        for r in rs:
            if r.source is None:
                continue
            lent.add(source_study(r.source))
            if (v := r.value) is not None and v > 0:
                by_study.setdefault(source_study(r.source), []).append(v)
        if not own:
            continue
        mean_own = sum(own) / len(own)
        for study, values in by_study.items():
            log_ratio = math.log((sum(values) / len(values)) / mean_own)
            logs.setdefault(study, []).append((log_ratio, 1 / len(values) + 1 / len(own)))
    out = []
    for study in sorted(lent):
        pairs = logs.get(study, [])
        gone = study in left_out
        if not pairs:
            out.append(Occasion(study=study, configurations=0, left_out=gone))
            continue
        k = len(pairs)
        centre = sum(lr for lr, _ in pairs) / k
        ratio = Interval(value=math.exp(centre))
        if sd is not None and df >= 1:
            half = t_quantile(0.95, df) * sd * math.sqrt(sum(w for _, w in pairs)) / k
            ratio.low, ratio.high = math.exp(centre - half), math.exp(centre + half)
        out.append(Occasion(study=study, configurations=k, ratio=ratio, left_out=gone))
    return out


def describe(o: Occasion) -> str:
    """One sentence on how ``o``'s runs read against the explanation's own."""
    if o.study.startswith(MACHINE_PREFIX):
        lent = f"runs measured here on an earlier machine ({o.study[len(MACHINE_PREFIX) : -1]})"
        own = "this machine's runs"
    else:
        lent, own = f"runs lent by study {o.study!r}", "this explanation's own runs"
    if o.ratio is None:
        return f"{lent} share no configuration with {own}: " + (
            "left out" if o.left_out else "a drift between the occasions is not measured"
        )
    r = o.ratio
    text = (
        f"{lent} read {100 * (r.value - 1):+.1f}% against {own} of the "
        f"same {o.configurations} configuration(s)"
    )
    if r.low is None or r.high is None:
        return text + " (no noise figure yet)"
    text += f" (95% interval {100 * (r.low - 1):+.1f}..{100 * (r.high - 1):+.1f}%)"
    if o.left_out:
        why = (
            "the occasions differ"
            if o.drift
            # the decision is frozen; the runs measured since can widen the interval
            else "they read apart on the runs there were when that was decided"
        )
        return text + f": {why}, so its runs are left out and what they stood for is measured here"
    if o.drift:
        return text + (
            ": the occasions differ, and the contributions that lean on those runs carry "
            "the difference"
        )
    return text + ": within the noise"
