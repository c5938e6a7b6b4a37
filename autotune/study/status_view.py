"""``autotune status``'s output: the :class:`~autotune.study.status.StudyStatus` as JSON
and as rich tables (summary, workers, running trials, unreadable records).

Apart from the model and its reading (:mod:`autotune.study.status`) so that each stays one
concept; every field shown here is one of the model's, under the same name.
"""

from __future__ import annotations

from datetime import timezone
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from autotune.study.environment import environment_line
from autotune.study.status import StudyStatus


def status_json(status: StudyStatus) -> dict[str, Any]:
    """The status as JSON-ready data (``autotune status --json``)."""
    return status.model_dump(mode="json")


def format_seconds(seconds: float) -> str:
    """``42s``, ``5m 12s``, ``3h 02m``, ``2d 04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _number(trial: int | None) -> str:
    return f"#{trial}" if trial is not None else ""


def _user(text: str | None) -> Text:
    """A string someone wrote (worker name, host, phase): never markup, one line."""
    from autotune.yamlio import escape_controls

    return Text(escape_controls(text or ""))


_LIVENESS_STYLE = {
    "running": "green",
    "lost": "bold red",
    "failed": "red",
    "interrupted": "yellow",
    "stopped": "dim",
}


def render_status(status: StudyStatus) -> RenderableType:
    """The status as rich tables: summary, workers, running trials, unreadable records."""
    parts: list[RenderableType] = []
    summary = Table(
        title=Text.assemble("study ", _user(status.study)),
        show_header=False,
        title_justify="left",
    )
    summary.add_column(style="bold")
    summary.add_column()
    s = status.states
    summary.add_row("as of", status.as_of.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"))
    others = ", ".join(
        f"{n} {k.lower()}"
        for k, n in s.items()
        if k not in ("COMPLETE", "RUNNING", "WAITING", "FAIL") and n
    )
    summary.add_row(
        "trials",
        f"{status.trials} total: {s.get('COMPLETE', 0)} complete, {s.get('RUNNING', 0)} running, "
        f"{s.get('WAITING', 0)} waiting, {s.get('FAIL', 0)} failed"
        + (f", {others}" if others else ""),
    )
    summary.add_row(
        "complete trials",
        f"{status.reused} reused, {status.infeasible} infeasible, {status.aborted} aborted early",
    )
    dup = Text(str(status.duplicate_configs), style="bold red" if status.duplicate_configs else "")
    if status.duplicate_trials:
        shown = "; ".join(
            ", ".join(f"#{n}" for n in group) for group in status.duplicate_trials[:5]
        )
        more = len(status.duplicate_trials) - 5
        dup.append(f" (trials {shown}" + (f"; {more} more" if more > 0 else "") + ")")
    summary.add_row("duplicate configs measured", dup)
    if status.carried:
        summary.add_row(
            "warm start",
            Text.assemble(
                f"{status.carried} failed launches carried from ",
                _user(", ".join(status.carried_from)),
                " (evidence for the sampler, not counted above)",
            ),
        )
    if status.best is not None:
        summary.add_row("best so far", f"trial #{status.best.trial}: {status.best.text}")
    elif status.best_error is not None:
        summary.add_row("best so far", Text(f"unavailable: {status.best_error}", style="red"))
    else:
        summary.add_row("best so far", "no feasible completed trial yet")
    if status.best_run is not None:
        summary.add_row(
            "best single run",
            f"{status.best_run.throughput:,.1f} tok/s (trial #{status.best_run.trial})",
        )
    if status.unowned_trials:
        summary.add_row("trials without a worker", str(status.unowned_trials))
    if status.unregistered_owners:
        summary.add_row(
            "owners without a record",
            _user(", ".join(f"{k} ({v})" for k, v in status.unregistered_owners.items())),
        )
    if status.environment is not None:
        differs = bool(status.environment.changes)
        summary.add_row(
            "environment",
            Text(environment_line(status.environment), style="yellow" if differs else ""),
        )
    if not status.workers:
        summary.add_row("workers", "no worker has recorded itself")
    parts.append(summary)

    workers = Table(
        title="workers",
        title_justify="left",
        caption="on: its trial and phase; done: COMPLETE trials it owns; run: trials done "
        "as its record says (its last process); lost: its trials failed because it stopped "
        "sending heartbeats",
        caption_justify="left",
    )
    for column in ("worker", "host:pid", "deployment"):  # shrink these first, never cut
        workers.add_column(column, overflow="fold", min_width=6)
    workers.add_column("state", no_wrap=True)
    workers.add_column("on", overflow="fold")
    for column in ("done", "run", "lost", "seen ago"):
        workers.add_column(column, justify="right", no_wrap=True)
    for w in status.workers:
        workers.add_row(
            _user(w.name),
            _user(f"{w.host}:{w.pid}"),
            _user(w.deployment),
            Text(w.liveness, style=_LIVENESS_STYLE.get(w.liveness, "")),
            _user(" ".join(x for x in (_number(w.trial), w.phase) if x)),
            str(w.done),
            str(w.done_reported),
            str(w.lost_trials) if w.lost_trials else "",
            format_seconds(w.seen_ago_s),
        )
    if status.workers:
        parts.append(workers)

    if status.running:
        running = Table(title="running trials", title_justify="left")
        for column in ("trial", "worker", "phase", "running for"):
            running.add_column(column)
        for r in status.running:
            who = _user(r.worker) if r.worker is not None else Text("?", style="dim")
            if r.worker_liveness == "lost":
                who.append(" (lost)", style="bold red")
            running.add_row(
                _number(r.number),
                who,
                _user(r.phase),
                format_seconds(r.running_s) if r.running_s is not None else "",
            )
        parts.append(running)

    if status.unreadable:
        bad = Table(title="unreadable worker records", title_justify="left")
        bad.add_column("key")
        bad.add_column("problem")
        for u in status.unreadable:
            bad.add_row(_user(u.key), _user(u.error))
        parts.append(bad)
    return Group(*parts)
