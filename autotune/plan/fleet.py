"""From one deployment to a fleet: replicas, GPUs, cost and energy for a target request rate.

A capacity study measured, for each configuration, the highest request rate one deployment
(one replica) sustains under the SLOs. Serving ``target`` req/s with ``headroom`` then takes
``ceil(target x (1 + headroom) / rate)`` replicas (:func:`autotune.plan.rates.replicas_needed`),
and the rate used is the lower 95% confidence bound over the configuration's measurements
(:attr:`ConfigEstimate.lower`, what ``best`` ranks by), not the mean: a fleet sized on the
mean is short about half the time the noise falls the other way. Where the rate comes from
when the study measured no capacity: :mod:`autotune.plan.rates`. Configurations that met the
SLOs at no rate measured are listed, never planned (:mod:`autotune.plan.excluded`).

Planned: the winner (``best``'s pick), the minimal winner of a stored explanation of it, the
best distinct configurations after it, and the baseline; the cheapest is marked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import optuna

from autotune.errors import AutotuneError
from autotune.explain import load_explanation, load_runs
from autotune.explain.minimal import minimal_trial
from autotune.plan.excluded import config_key, failed_counts, never_met, why_not
from autotune.plan.model import FleetPlan, FleetRow, Unplannable
from autotune.plan.rates import (
    Rate,
    RateKind,
    per_replica_rate,
    rate_kind,
    rate_source,
    replicas_needed,
)
from autotune.plan.settings import PlanSettings
from autotune.results import (
    THROUGHPUT,
    ConfigEstimate,
    TrialResult,
    baseline_trial,
    best_estimate,
    config_estimates,
    load_results,
    metric_value,
    objective_label,
    ranked_estimates,
)


def make_plan(
    study: optuna.Study,
    settings: PlanSettings,
    *,
    gpus: Mapping[str, tuple[int, str]] | None = None,
) -> FleetPlan:
    """The fleet plan of ``study`` for ``settings``.

    ``gpus``: deployment name -> (GPUs, file), :func:`autotune.plan.deployment_gpus` of the
    trials' deployments; ``settings.gpus_per_replica`` overrides it."""
    names = list(study.metric_names or [THROUGHPUT])
    kind = rate_kind(names, settings)
    builder = _Builder(study, settings, kind, gpus or {})
    return builder.plan()


class _Builder:
    """Reads the study once and assembles the plan's rows, exclusions and notes."""

    def __init__(
        self,
        study: optuna.Study,
        settings: PlanSettings,
        kind: RateKind,
        gpus: Mapping[str, tuple[int, str]],
    ) -> None:
        self.study, self.settings, self.kind, self.gpus = study, settings, kind, gpus
        self.names = list(study.metric_names or [THROUGHPUT])
        self.what, self.unit = objective_label(self.names)
        self.results = load_results(study)
        self.estimates = config_estimates(study)
        self.winner = best_estimate(study)
        self.baseline = baseline_trial(study)
        self.notes: list[str] = []
        self.unplannable: list[Unplannable] = []

    # --- the rows -------------------------------------------------------------------------

    def plan(self) -> FleetPlan:
        rows = self._rows()
        rows = _mark_cheapest(rows)
        self._general_notes(rows)
        return FleetPlan(
            study=self.study.study_name,
            settings=self.settings,
            provisioned_rate=self.settings.provisioned_rate,
            objective=self.names[0],
            rate_source=rate_source(self.kind, self.settings, self.what),
            rows=rows,
            unplannable=self.unplannable
            + never_met(
                self.kind, self.results, self.estimates, {u.trial for u in self.unplannable}
            ),
            failed=failed_counts(self.results),
            notes=self.notes,
        )

    def _rows(self) -> list[FleetRow]:
        if self.winner is None:
            self.notes.append(
                "No configuration met the SLOs at any rate measured: nothing can be planned."
                if any(r.measured for r in self.results)
                else "No trial was measured yet: nothing can be planned."
            )
            if self.baseline is not None:  # said with the others' reasons, not left out
                self._baseline_not_planned(self.baseline)
            return []
        chosen: list[tuple[list[str], ConfigEstimate]] = []
        keys: dict[str, int] = {}
        ranked = _distinct(ranked_estimates(self.study))
        for rank, e in enumerate(ranked[: self.settings.top], start=1):
            label = "winner" if e.trial.number == self.winner.trial.number else f"#{rank}"
            keys[config_key(e.trial)] = len(chosen)
            chosen.append(([label], e))
        base_row: tuple[list[str], ConfigEstimate] | None = None
        if self.baseline is not None:
            at = keys.get(config_key(self.baseline))
            base = next((e for e in self.estimates if e.trial.number == self.baseline.number), None)
            if at is not None:
                chosen[at][0].append("baseline")
            elif base is not None and base.eligible:
                base_row = (["baseline"], base)
            else:
                self._baseline_not_planned(self.baseline)
        rows = []
        for labels, e in chosen:
            row = self._row(", ".join(labels), e.trial, self._rate(e), e)
            if row is not None:
                rows.append(row)
            if labels[0] == "winner":
                minimal = self._minimal()
                if minimal is not None:
                    rows.append(minimal)
        if base_row is not None:
            row = self._row("baseline", base_row[1].trial, self._rate(base_row[1]), base_row[1])
            if row is not None:
                rows.append(row)
        return rows

    def _baseline_not_planned(self, baseline: TrialResult) -> None:
        base = next((e for e in self.estimates if e.trial.number == baseline.number), None)
        self.unplannable.append(
            Unplannable(
                label="baseline",
                trial=baseline.number,
                reason=why_not(self.kind, baseline, base),
            )
        )

    def _row(
        self,
        label: str,
        trial: TrialResult,
        rate: Rate | None,
        estimate: ConfigEstimate | None,
        *,
        minimal: bool = False,
    ) -> FleetRow | None:
        if rate is None or rate.lower <= 0:
            why = (
                "its rate could not be read from the measurements"
                if rate is None
                else "the lower bound of its rate is 0 (the noise is larger than the rate)"
            )
            self.unplannable.append(Unplannable(label=label, trial=trial.number, reason=why))
            return None
        s = self.settings
        replicas = replicas_needed(s.provisioned_rate, rate.lower)
        per = s.gpus_per_replica or self.gpus.get(trial.deployment or "", (None, ""))[0]
        gpus = None if per is None else per * replicas
        cost = None if gpus is None or s.gpu_hour_cost is None else gpus * s.gpu_hour_cost
        tokens = _tokens_per_request(trial.metrics)
        per_million = None
        if cost is not None and tokens:
            per_million = cost / (s.target_rate * tokens * 3600.0) * 1e6
        notes = []
        at_limit = bool(trial.capacity) and (trial.capacity or {}).get("upper") is None
        if at_limit:
            notes.append(
                "its capacity search passed its highest load: the rate is at least this "
                "(the plan is conservative)"
            )
        if estimate is not None and estimate.remeasured and estimate.n < len(estimate.measurements):
            notes.append(f"{len(estimate.measurements) - estimate.n} measurement(s) left out")
        telemetry = trial.telemetry
        return FleetRow(
            label=label,
            trial=trial.number,
            minimal=minimal,
            changes=_changes(trial, self.baseline),
            deployment=trial.deployment,
            rate_mean=rate.mean,
            rate_lower=rate.lower,
            measurements=rate.n,
            at_limit=at_limit,
            replicas=replicas,
            gpus_per_replica=per,
            gpus=gpus,
            rate_per_gpu=None if per is None else rate.lower / per,
            cost_per_hour=cost,
            output_tokens_per_request=tokens,
            cost_per_million_tokens=per_million,
            energy_per_token_j=None if telemetry is None else telemetry.energy_per_token_j,
            notes=notes,
        )

    def _minimal(self) -> FleetRow | None:
        """The minimal winner of a stored explanation of the current winner, else a note."""
        assert self.winner is not None
        try:
            explanation = load_explanation(self.study)
        except AutotuneError as exc:
            self.notes.append(f"The stored explanation cannot be read ({exc}): no minimal winner.")
            return None
        name = self.study.study_name
        if explanation is None:
            self.notes.append(
                f"No minimal winner: `autotune explain --study {name}` finds the fewest of the "
                "winner's changes that keep its rate."
            )
            return None
        if explanation.winner != self.winner.trial.number or explanation.minimal is None:
            why = (
                f"the stored explanation is of trial #{explanation.winner}, not the winner"
                if explanation.winner != self.winner.trial.number
                else "the stored explanation has none"
            )
            self.notes.append(
                f"No minimal winner ({why}): `autotune explain --study {name}` finds it."
            )
            return None
        m = explanation.minimal
        if not m.dropped:
            self.notes.append(
                "The minimal winner is the winner: every one of its changes is needed."
            )
            return None
        try:
            trial = minimal_trial(explanation, load_runs(self.study), self.winner.trial)
        except AutotuneError as exc:
            self.notes.append(f"No minimal winner planned: {exc}.")
            return None
        if m.measured.mean is None:
            return None
        value = m.measured.mean.value
        low = m.measured.mean.low if m.measured.mean.low is not None else value
        rate = self._scaled(trial, value, max(low, 0.0), m.measured.n)
        label = "minimal winner" + ("" if m.complete else " (search not finished)")
        return self._row(label, trial, rate, None, minimal=True)

    # --- the per-replica rate -------------------------------------------------------------

    def _rate(self, e: ConfigEstimate) -> Rate | None:
        return self._scaled(e.trial, e.mean, e.lower, e.n, e)

    def _scaled(
        self, trial: TrialResult, mean: float, lower: float, n: int, e: ConfigEstimate | None = None
    ) -> Rate | None:
        assert self.winner is not None
        return per_replica_rate(self.kind, self.settings, self.winner, trial, mean, lower, n, e)

    # --- what the plan assumes ------------------------------------------------------------

    def _general_notes(self, rows: Sequence[FleetRow]) -> None:
        """What the planned figures assume and lack, ahead of the other notes; nothing when
        nothing is planned (the note that says why is the one that matters)."""
        if not rows:
            return
        s = self.settings
        notes = [
            f"Replicas = ceil(target x (1 + headroom) / the per-replica rate's lower 95% bound) "
            f"= ceil({s.target_rate:g} x {1 + s.headroom:g} / bound). Assumes the requests are "
            "spread evenly over the replicas, the replicas share no bottleneck (network, "
            "storage, a router), and production traffic has the study's load shape (its "
            "dataset, arrivals and SLOs)."
        ]
        if self.kind == "stated":
            notes.append(self._one_load_level())
        elif self.winner is not None and self.winner.half_width is None:
            notes.append(
                "No configuration was measured more than once: each lower bound is its single "
                "measurement (no confidence interval yet; `autotune run` re-measures the best "
                "ones in its race)."
            )
        if not s.gpu_hour_cost:
            notes.append("No --gpu-hour-cost given: the cost columns are omitted.")
        unknown = sorted({r.deployment or "(none recorded)" for r in rows if r.gpus is None})
        if unknown:
            notes.append(
                "GPUs per replica unknown for deployment "
                + ", ".join(unknown)
                + " (no gpus: in a deployment file of that name): GPU and cost figures "
                "omitted for it; --gpus-per-replica N sets it."
            )
        elif rows and s.gpus_per_replica:
            notes.append(f"GPUs per replica: {s.gpus_per_replica} (--gpus-per-replica).")
        elif rows:
            used = {r.deployment or "" for r in rows}
            where = sorted(f"{d}: {n} from {f}" for d, (n, f) in self.gpus.items() if d in used)
            notes.append(
                "GPUs per replica: the deployment file's gpus: (" + "; ".join(where) + ")."
            )
        if s.gpu_hour_cost and any(r.cost_per_million_tokens is not None for r in rows):
            notes.append(
                "Cost per million output tokens: the fleet's cost per hour over the output "
                "tokens the target rate produces in an hour (output tokens per request as "
                "measured where the rate was); the headroom is paid for and idles."
            )
        energy = [r for r in rows if r.energy_per_token_j is not None]
        if energy:
            notes.append(
                "J/token: the GPUs' energy over the trial's measured phase per output token"
                + (
                    " (a capacity search: every probe, at loads below and above capacity), "
                    if self.kind != "stated"
                    else " "
                )
                + "not at the load each replica of the fleet would carry."
            )
        elif rows:
            why = next(
                (
                    r.telemetry.reason
                    for r in self.results
                    if r.telemetry is not None and not r.telemetry.available
                ),
                None,
            )
            notes.append(
                "No J/token: no trial recorded its GPUs' energy"
                + (f" ({why})" if why else " (no GPU telemetry in this study)")
                + "."
            )
        self.notes[:0] = notes

    def _one_load_level(self) -> str:
        assert self.winner is not None
        served = metric_value(self.winner.trial.metrics, "request_throughput")
        at = f" (there the winner completed {served:,.2f} req/s)" if served is not None else ""
        return (
            f"This study measured each configuration at one load level{at}, so it does not "
            "know the highest rate under the SLOs. The plan assumes the winner sustains "
            f"--per-replica-rate {self.settings.per_replica_rate:g} req/s under them and that "
            f"every configuration's sustainable rate is in proportion to its {self.what} at "
            "that one load; neither was measured. A capacity study (objective: capacity) "
            "measures both."
        )


def _mark_cheapest(rows: list[FleetRow]) -> list[FleetRow]:
    """The same rows, the cheapest marked: fewest GPUs where every row knows its GPUs (the
    price per GPU-hour is one, so that is the cheapest per hour), else fewest replicas;
    ties to the higher lower bound, then the earlier row."""
    if not rows:
        return rows
    by_gpus = all(r.gpus is not None for r in rows)
    best = min(
        range(len(rows)),
        key=lambda i: (
            rows[i].gpus if by_gpus else rows[i].replicas,
            -rows[i].rate_lower,
            i,
        ),
    )
    return [r.model_copy(update={"cheapest": i == best}) for i, r in enumerate(rows)]


def _distinct(estimates: Sequence[ConfigEstimate]) -> list[ConfigEstimate]:
    seen: set[str] = set()
    out = []
    for e in estimates:
        key = config_key(e.trial)
        if key in seen:
            continue
        seen.add(key)
        out.append(e)
    return out


def _changes(trial: TrialResult, baseline: TrialResult | None) -> int | None:
    if baseline is None or not baseline.config:
        return None
    keys = set(trial.config) | set(baseline.config)
    missing = object()
    return sum(1 for k in keys if trial.config.get(k, missing) != baseline.config.get(k, missing))


def _tokens_per_request(metrics: Mapping[str, object]) -> float | None:
    out = metric_value(metrics, "output_throughput")
    req = metric_value(metrics, "request_throughput")
    if out is None or req is None or req <= 0 or out <= 0:
        return None
    return out / req
