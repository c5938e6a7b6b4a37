"""The minimal winner as a trial the exporters take (``best --minimal --export ...``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.errors import AutotuneError
from autotune.explain.record import ExplainRun, Explanation
from autotune.results import TrialResult, metric_value


def minimal_trial(
    explanation: Explanation, runs: Mapping[str, Sequence[ExplainRun]], winner: TrialResult
) -> TrialResult:
    """The minimal winner of ``explanation`` as a :class:`TrialResult`: its configuration,
    the services as its last successful run started them, the mean of its runs as value.

    ``winner`` (the study's current winner) must be the trial explained: an explanation of
    an earlier winner is refused, not exported.
    """
    if explanation.winner != winner.number:
        raise AutotuneError(
            f"the stored explanation is of trial #{explanation.winner}, but the winner is now "
            f"#{winner.number}: run `autotune explain` again"
        )
    minimal = explanation.minimal
    if minimal is None:
        raise AutotuneError(
            "the stored explanation has no minimal winner (it ran with --no-minimal): run "
            "`autotune explain --minimal`"
        )
    if not minimal.dropped:
        return winner  # every change is needed: the minimal winner is the winner
    key = minimal.measured.key
    done = [r for r in runs.get(key or "", ()) if r.value is not None and r.services]
    if not done or minimal.measured.mean is None:
        raise AutotuneError(
            f"the minimal winner of trial #{winner.number} has no successful run stored"
        )
    last = done[-1]
    mean = minimal.measured.mean.value
    values = [mean, *(winner.values or [])[1:]]
    return TrialResult(
        number=winner.number,
        label="minimal",
        state=winner.state,
        values=values,
        metric_names=winner.metric_names,
        params={k: v for k, v in last.config.items() if k in winner.params or k in minimal.config},
        config=last.config,
        services=last.services,
        metrics=last.metrics,
        engine_version=last.engine_version,
        overrides=last.overrides,
        telemetry=last.telemetry,
        deployment=winner.deployment,
        feasible=all(r.feasible for r in done),
        throughput=mean,
        tpot_p99_ms=metric_value(last.metrics, "tpot_ms", "p99"),
    )
