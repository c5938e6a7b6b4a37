"""Plain-text exports of a trial: shell environment, command lines, JSON.

These are for people who start services by hand or from their own tooling; the systemd
export (``systemd.py``) is for machines managed by systemd.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autotune.export.topology import start_order
from autotune.results import ServiceRecord, TrialResult


def export_env(trial: TrialResult) -> str:
    """``unset X`` / ``export A=...`` per service, shell-quoted, in start order."""
    out = [f"# autotune trial {trial.number}: environment per service"]
    for name in start_order(trial.services):
        rec = trial.services[name]
        out.append(f"# --- {name}")
        out += [f"unset {shlex.quote(var)}" for var in sorted(rec.unset_env)]
        out += [f"export {k}={shlex.quote(v)}" for k, v in sorted(rec.env.items())]
    return "\n".join(out) + "\n"


def command_line(rec: ServiceRecord) -> str:
    """The stored paste-able line, else one rebuilt like ``ServiceSpec.command_line``."""
    if rec.command:
        return rec.command
    parts: list[str] = []
    if rec.env or rec.unset_env:
        parts.append("env")
        for var in sorted(rec.unset_env):
            parts += ["-u", var]
        parts += [f"{k}={v}" for k, v in sorted(rec.env.items())]
    return shlex.join(parts + list(rec.argv))


def export_command(trial: TrialResult) -> str:
    """One paste-able command line per service, in start order, each under a comment."""
    out = [f"# autotune trial {trial.number}: start each service in this order"]
    for name in start_order(trial.services):
        out += [f"# --- {name}", command_line(trial.services[name])]
    return "\n".join(out) + "\n"


def export_json(trial: TrialResult) -> str:
    """Configuration, services and metrics of the trial as indented JSON."""
    doc: dict[str, Any] = {
        "trial": trial.number,
        "state": trial.state,
        "feasible": trial.feasible,
        "is_baseline": trial.is_baseline,
        "deployment": trial.deployment,
        "values": dict(zip(trial.metric_names, trial.values or [], strict=False)),
        "output_throughput_tok_s": trial.throughput,
        "tpot_p99_ms": trial.tpot_p99_ms,
        "config": trial.config,
        "services": {
            name: {**rec.model_dump(exclude_none=True), "command": command_line(rec)}
            for name, rec in trial.services.items()
        },
        "start_order": start_order(trial.services),
        "metrics": trial.metrics,
        "effective": trial.effective,
        "overrides": trial.overrides,
    }
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"
