"""A self-contained HTML report of a study: one file, plotly.js inlined, no network access.

Everything is read through :mod:`autotune.results` (the stored trial schema). Every value that
comes from the study (configuration, commands, failure reasons) is HTML-escaped; plotly
escapes ``<`` and ``/`` inside its JSON, so a planted ``</script>`` cannot end a script block.
Every trial is redacted again on the way in (:func:`autotune.export.redact_trial`): a study
written before redaction existed, or by other tooling, cannot put a credential in a report
that is meant to be shared.
Sections degrade to a sentence when there is nothing to show (no trials, no feasible trial,
too few trials for importances, no latency-throughput curve). Figures and table heads name
the study's first objective and its unit (:func:`autotune.results.objective_label`).

One module per part of the page, all sharing :mod:`autotune.report._common` (style,
escaping, tables):

* :mod:`~autotune.report.page`: :func:`write_report`, the order of the sections, the summary;
* :mod:`~autotune.report.search`: the Pareto front, the history, parameter importances;
* :mod:`~autotune.report.curves`: latency-throughput curves, tok/s per user against per GPU;
* :mod:`~autotune.report.explanation` and :mod:`~autotune.report.waterfall`: what
  ``autotune explain`` stored;
* :mod:`~autotune.report.tables`: time per trial, noise, failures, the top trials;
* :mod:`~autotune.report.telemetry`: the GPUs' utilization, memory, power and J/token
  (the summary's row and the top table's columns).
"""

from __future__ import annotations

from autotune.report._common import Objective
from autotune.report.curves import deployment_gpus, nondominated
from autotune.report.page import write_report
from autotune.report.search import param_importances
from autotune.report.waterfall import WaterfallBar, waterfall_bars, waterfall_figure

__all__ = [
    "Objective",
    "WaterfallBar",
    "deployment_gpus",
    "nondominated",
    "param_importances",
    "waterfall_bars",
    "waterfall_figure",
    "write_report",
]
