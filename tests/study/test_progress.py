"""What a run prints per trial: ``trial 3/12``, and no made-up total where none is known."""

from __future__ import annotations

import io

from autotune.study.progress import PlainProgress, TrialReport


def _line(*, index: int, total: int, kind: str = "trial") -> str:
    stream = io.StringIO()
    progress = PlainProgress(stream)
    progress.trial_started(number=7, index=index, total=total, config={}, kind=kind)
    report = TrialReport(
        number=7,
        throughput=1234.5,
        failure=None,
        reason=None,
        best=1234.5,
        best_number=7,
        seconds=2.0,
        reused_from=None,
    )
    progress.trial_finished(report)
    return stream.getvalue()


def test_a_trial_line_counts_against_the_target() -> None:
    assert _line(index=3, total=12).startswith("trial 3/12 (#7): 1,234.5 tok/s")


def test_an_explanation_run_has_no_total_to_count_against() -> None:
    # An explanation's restarts are decided as it goes (a close call takes more runs): the
    # line says which run this is, not "5/0".
    line = _line(index=5, total=0, kind="explain (ablation: the winner, run 1)")
    assert line.startswith("explain (ablation: the winner, run 1) 5 (#7): 1,234.5 tok/s")
    assert "/0" not in line
