"""A self-contained HTML report of a study: one file, plotly.js inlined, no network access.

Everything is read through :mod:`autotune.results` (the stored trial schema). Every value that
comes from the study (configuration, commands, failure reasons) is HTML-escaped; plotly
escapes ``<`` and ``/`` inside its JSON, so a planted ``</script>`` cannot end a script block.
Every trial is redacted again on the way in (:func:`autotune.export.redact_trial`): a study
written before redaction existed, or by other tooling, cannot put a credential in a report
that is meant to be shared. Figures and table heads name the study's first objective and its
unit (:func:`autotune.results.objective_label`).

One module per section, each a function of :class:`~autotune.report._data.ReportData` (the
study read once) that returns its HTML, or ``None`` when the study has nothing it needs: a
section is left out, never shown empty. In the page's order (:mod:`~autotune.report.page`):

* :mod:`~autotune.report.summary`: the study, the winner, its GPUs, the cheapest fleet;
* :mod:`~autotune.report.explanation` (with :mod:`~autotune.report.waterfall`): what
  ``autotune explain`` measured, leading when it exists;
* :mod:`~autotune.report.fleet`: the fleet plan ``autotune plan`` asked for last;
* :mod:`~autotune.report.pareto`, :mod:`~autotune.report.curves`,
  :mod:`~autotune.report.frontier`, :mod:`~autotune.report.history`: what the search saw;
* :mod:`~autotune.report.importance`: Optuna's importances, labelled as where the trials
  varied, beside each lever's measured contribution;
* :mod:`~autotune.report.noise`, :mod:`~autotune.report.timing`,
  :mod:`~autotune.report.failures`, :mod:`~autotune.report.top`: noise, time, failures and
  the top trials.

Shared: :mod:`~autotune.report._common` (style, escaping, tables), ``_points`` (curve
points), ``_importances`` (Optuna's figures), :mod:`~autotune.report.telemetry` (GPU rows).
"""

from __future__ import annotations

from autotune.plan import deployment_gpus
from autotune.report._common import Objective
from autotune.report._importances import param_importances
from autotune.report.frontier import nondominated
from autotune.report.page import SECTIONS, write_report
from autotune.report.waterfall import WaterfallBar, waterfall_bars, waterfall_figure

__all__ = [
    "SECTIONS",
    "Objective",
    "WaterfallBar",
    "deployment_gpus",
    "nondominated",
    "param_importances",
    "waterfall_bars",
    "waterfall_figure",
    "write_report",
]
