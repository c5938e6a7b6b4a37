"""The page: :func:`write_report` reads the study once (:func:`autotune.report._data.read`)
and puts the sections together in their order, leaving out each one the study has nothing
for.

The order is the reader's: the summary, then what each change bought (the explanation, when
one exists, leads the analysis), what a fleet of the result costs, then what the search saw
(the Pareto front, curves, history, importances), then noise, time, failures and the top
trials with their commands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import optuna
from plotly.offline import get_plotlyjs

from autotune.report import (
    curves,
    explanation,
    failures,
    fleet,
    frontier,
    history,
    importance,
    noise,
    pareto,
    summary,
    timing,
    top,
)
from autotune.report._common import _CSS, _e
from autotune.report._data import ReportData, read

SECTIONS: tuple[tuple[str, Callable[[ReportData], str | None]], ...] = (
    ("summary", summary.section),
    ("explanation", explanation.section),
    ("fleet", fleet.section),
    ("pareto", pareto.section),
    ("curves", curves.section),
    ("frontier", frontier.section),
    ("history", history.section),
    ("importance", importance.section),
    ("noise", noise.section),
    ("time", timing.section),
    ("failures", failures.section),
    ("top", top.section),
)
"""Each section's anchor and its function, in the page's order."""


def write_report(
    study: optuna.Study, *, path: Path, deployment_dirs: Sequence[Path] | None = None
) -> Path:
    """Render ``study`` into one HTML file at ``path`` (parent directories created).

    ``deployment_dirs``: where the deployment files are looked up by the trials'
    deployment names for their GPU count (:func:`autotune.plan.deployment_gpus`; default:
    ``launchers/`` in the working directory, then the bundled ones)."""
    data = read(study, deployment_dirs=deployment_dirs)
    sections = [html for _, render in SECTIONS if (html := render(data)) is not None]
    title = f"autotune report: {study.study_name}"
    doc = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n"
        f'<script type="text/javascript">{get_plotlyjs()}</script>\n</head>\n<body>\n'
        f"<h1>{_e(title)}</h1>\n"
        f'<p class="note">generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}</p>\n'
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc, encoding="utf-8")
    return path
