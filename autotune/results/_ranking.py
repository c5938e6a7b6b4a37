"""Which configuration wins: the Pareto front and the ranking by the lower confidence bound.

The best single-run figure of a study is biased up, so the winner is picked per
configuration from its :class:`~autotune.results._estimates.ConfigEstimate` by the lower
95% confidence bound (ties: the mean, the lower TPOT p99, the earlier trial). ``best``, the
re-measure race's candidates, the warm start's top configurations and the re-measure
candidates all rank here, in one module, so they follow one rule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

import optuna
from optuna.study import StudyDirection

from autotune.results._estimates import ConfigEstimate, config_estimates
from autotune.results._trials import TrialResult, feasible, own_trials


def pareto_front(study: optuna.Study) -> list[TrialResult]:
    """Feasible, fully measured (not early-aborted) COMPLETE trials not dominated by another
    (by the study's directions)."""
    directions = study.directions
    candidates = [t for t in own_trials(study) if feasible(t) and not t.user_attrs.get("aborted")]
    front = [
        t
        for t in candidates
        if not any(dominates(o.values, t.values, directions) for o in candidates if o is not t)
    ]
    return [TrialResult.from_frozen(t, metric_names=study.metric_names) for t in front]


def best_trial(study: optuna.Study) -> TrialResult | None:
    """The trial to deploy: the configuration with the highest conservative throughput.

    Single objective: every feasible, fully measured configuration is ranked by
    :attr:`ConfigEstimate.lower` (its mean when the study has no repeated measurement, so
    then simply the highest throughput); an early-aborted trial is not a candidate unless
    re-measured, nor is a configuration whose re-measurement failed. Multi-objective studies
    pick from the feasible Pareto front the same way. Ties go to the higher mean, the lower
    TPOT p99, then the earlier trial. ``None`` when no trial qualifies.
    """
    best = best_estimate(study)
    return best.trial if best is not None else None


def best_estimate(study: optuna.Study) -> ConfigEstimate | None:
    """The winning configuration's estimate (see :func:`best_trial`)."""
    ranked = winner_candidates(study)
    return ranked[0] if ranked else None


def winner_candidates(
    study: optuna.Study, estimates: Sequence[ConfigEstimate] | None = None
) -> list[ConfigEstimate]:
    """The configurations :func:`best_estimate` chooses from, best first, one per distinct
    configuration: eligible estimates (on the feasible Pareto front in a multi-objective
    study) ranked by the lower bound, then the mean, the lower TPOT p99, the earlier trial.

    The re-measurement race (``autotune.study.race``) races exactly these, in this order,
    so the configuration it leaves in front is the one ``best`` reports. ``estimates``:
    :func:`config_estimates` of the study, when the caller has read them already.
    """
    if estimates is None:
        estimates = config_estimates(study)
    estimates = [e for e in estimates if e.eligible]
    if len(study.directions) > 1:
        front = {r.number for r in pareto_front(study)}
        estimates = [e for e in estimates if e.trial.number in front]
    return _distinct(sorted(estimates, key=_rank))


def _distinct(ranked: Iterable[ConfigEstimate]) -> list[ConfigEstimate]:
    """The first estimate of each distinct configuration, in ``ranked``'s order."""
    seen: set[str] = set()
    out = []
    for e in ranked:
        key = _config_key(e)
        if key and key in seen:
            continue
        seen.add(key)
        out.append(e)
    return out


def _rank(e: ConfigEstimate) -> tuple[float, float, float, int]:
    """How ``best`` orders configurations: lower bound, mean, TPOT p99, trial number."""
    tpot = e.trial.tpot_p99_ms if e.trial.tpot_p99_ms is not None else math.inf
    return (-e.lower, -e.mean, tpot, e.trial.number)


def ranked_estimates(study: optuna.Study) -> list[ConfigEstimate]:
    """Every eligible configuration, best first, in the order :func:`best_estimate` ranks
    them (its first is ``best``'s winner); with several objectives the Pareto front's come
    first. A warm start takes its top configurations from here."""
    estimates = sorted((e for e in config_estimates(study) if e.eligible), key=_rank)
    if len(study.directions) > 1:
        front = {r.number for r in pareto_front(study)}
        estimates.sort(key=lambda e: e.trial.number not in front)  # stable: rank kept
    return estimates


def _config_key(e: ConfigEstimate) -> str:
    return json.dumps(e.trial.config, sort_keys=True, default=str) if e.trial.config else ""


def dominates(
    a: Sequence[float] | None, b: Sequence[float] | None, directions: Sequence[StudyDirection]
) -> bool:
    """``a`` is at least as good as ``b`` in every objective and better in one."""
    if a is None or b is None:
        return False
    better = False
    for x, y, d in zip(a, b, directions, strict=False):
        if d == StudyDirection.MINIMIZE:
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            better = True
    return better


def remeasure_candidates(study: optuna.Study, top_k: int) -> list[ConfigEstimate]:
    """The ``top_k`` distinct feasible, fully measured configurations by mean throughput."""
    ranked = sorted(
        (e for e in config_estimates(study) if e.eligible),
        key=lambda e: (-e.mean, e.trial.number),
    )
    return _distinct(ranked)[:top_k]
