"""Reading finished trials back out of an Optuna study into typed models.

The study stores every trial the same way: values, constraint keys, and the fields of a
:class:`~autotune.trial.record.TrialRecord` as user attributes (the model the writer uses
too). Report and export read trials only through :class:`TrialResult`, built from that
record, so a schema change is absorbed in the record module, in one place.

Noise: one measurement of a configuration is one draw (on the simulated deployment each
server process runs a few percent faster or slower than the model, and that does not
average out within a run). The best single-run figure of a study is therefore biased up and
often not the best configuration. So the winner is picked per configuration from all its
measurements (the trial plus its re-measurements, stored as study attributes
``remeasure:N:R``) by a lower 95% confidence bound (:class:`ConfigEstimate`), with the
study's run-to-run noise pooled over every configuration measured more than once. The
re-measure phase's race (``autotune.study.race``) works on the same intervals and the same
candidates (:func:`winner_candidates`), so the configuration it leaves in front is the one
:func:`best_estimate` picks.

This package is the one public entry point: it re-exports, unchanged, what its private
modules define, one concept each:

* ``_trials``: :class:`TrialResult` from the stored record, feasibility, the study's own
  trials, objective values and metrics, the baseline and the gain over it;
* ``_noise``: Student t quantiles, interval half-widths, the conservative lower bound and
  the pooled run-to-run noise (pure arithmetic);
* ``_estimates``: re-measurements (:class:`Measurement`) and one :class:`ConfigEstimate`
  per measured configuration;
* ``_ranking``: the Pareto front and the ranking by the lower bound (``best``, the race's
  candidates, the warm start's, the re-measure candidates): one module keeps one rule;
* ``_labels``: the objective's label and unit, and an estimate written out.

They import one way (``_labels`` and ``_ranking`` > ``_estimates`` > ``_trials`` and
``_noise``). Import from here; to patch a function in a test, patch it where it is defined
(the module that calls it), since this facade only holds references.
"""

from __future__ import annotations

from autotune.results._estimates import (
    REMEASURE_PREFIX,
    ConfigEstimate,
    Measurement,
    bracket_width,
    cards_of,
    cards_text,
    config_estimates,
    load_remeasurements,
    machines_of,
    remeasure_key,
    study_cards,
)
from autotune.results._labels import OBJECTIVE_LABELS, format_estimate, objective_label
from autotune.results._noise import conservative, half_width, noise_level, t975, t_quantile
from autotune.results._ranking import (
    best_estimate,
    best_trial,
    dominates,
    pareto_front,
    ranked_estimates,
    remeasure_candidates,
    winner_candidates,
)
from autotune.results._trials import (
    THROUGHPUT,
    TPOT_P99,
    WARM_START_ATTR,
    TrialResult,
    baseline_trial,
    carried,
    feasible,
    gain_over_baseline,
    launched,
    load_results,
    metric_value,
    own_trials,
)
from autotune.trial.record import ServiceRecord

__all__ = [
    "OBJECTIVE_LABELS",
    "REMEASURE_PREFIX",
    "THROUGHPUT",
    "TPOT_P99",
    "WARM_START_ATTR",
    "ConfigEstimate",
    "Measurement",
    "ServiceRecord",
    "TrialResult",
    "baseline_trial",
    "best_estimate",
    "best_trial",
    "bracket_width",
    "cards_of",
    "cards_text",
    "carried",
    "config_estimates",
    "conservative",
    "dominates",
    "feasible",
    "format_estimate",
    "gain_over_baseline",
    "half_width",
    "launched",
    "load_remeasurements",
    "load_results",
    "machines_of",
    "metric_value",
    "noise_level",
    "objective_label",
    "own_trials",
    "pareto_front",
    "ranked_estimates",
    "remeasure_candidates",
    "remeasure_key",
    "study_cards",
    "t975",
    "t_quantile",
    "winner_candidates",
]
