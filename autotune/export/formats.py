"""Plain-text exports of a trial: shell environment, command lines, JSON.

These are for people who start services by hand or from their own tooling; the systemd
export (``systemd.py``) is for machines managed by systemd.

No credential is ever printed (:mod:`autotune.export.credentials`): a secret variable or a
secret flag's value is written as a reference, ``"${HF_TOKEN:?...}"`` or
``"${AUTOTUNE_SECRET_API_KEY:?...}"``, so a pasted line uses the value from the shell and
fails loudly when it is unset. The JSON keeps the stored ``<redacted>`` values and lists the
variables to supply under ``secrets``.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autotune.export.credentials import Ref, redact_trial, shell_reference, split_service
from autotune.export.topology import start_order
from autotune.results import ServiceRecord, TrialResult


def export_env(trial: TrialResult) -> str:
    """``unset X`` / ``export A=...`` per service, shell-quoted, in start order."""
    trial = redact_trial(trial)
    out = [f"# autotune {trial.title}: environment per service"]
    for name in start_order(trial.services):
        rec = trial.services[name]
        split = split_service(rec)
        out.append(f"# --- {name}")
        out += [f"unset {shlex.quote(var)}" for var in sorted(rec.unset_env)]
        for var in sorted(rec.env):
            value = split.env.get(var)
            word = shlex.quote(value) if value is not None else shell_reference(var)
            out.append(f"export {var}={word}")
        out += [
            f'# secret {slot.what}: pass it as "${slot.var}"'
            for slot in split.slots
            if slot.flag is not None
        ]
    return "\n".join(out) + "\n"


def command_line(rec: ServiceRecord) -> str:
    """The stored paste-able line, else one rebuilt like ``ServiceSpec.command_line``; with
    secrets, always rebuilt, each secret a shell reference to its variable."""
    split = split_service(rec)
    if rec.command and not split.slots:
        return rec.command
    words: list[str] = []
    if rec.env or rec.unset_env:
        words.append("env")
        for var in sorted(rec.unset_env):
            words += ["-u", shlex.quote(var)]
        for var in sorted(rec.env):
            value = split.env.get(var)
            ref = shell_reference(var)
            words.append(shlex.quote(f"{var}={value}") if value is not None else f"{var}={ref}")
    for arg in split.argv:
        if isinstance(arg, Ref):
            prefix = shlex.quote(arg.prefix) if arg.prefix else ""
            words.append(prefix + shell_reference(arg.var))
        else:
            words.append(shlex.quote(arg))
    return " ".join(words)


def export_command(trial: TrialResult) -> str:
    """One paste-able command line per service, in start order, each under a comment."""
    trial = redact_trial(trial)
    out = [f"# autotune {trial.title}: start each service in this order"]
    for name in start_order(trial.services):
        out += [f"# --- {name}", command_line(trial.services[name])]
    return "\n".join(out) + "\n"


def export_json(trial: TrialResult) -> str:
    """Configuration, services and metrics of the trial as indented JSON."""
    trial = redact_trial(trial)
    doc: dict[str, Any] = {
        "trial": trial.number,
        **({"minimal_winner": True} if trial.label == "minimal" else {}),
        "state": trial.state,
        "feasible": trial.feasible,
        "is_baseline": trial.is_baseline,
        "deployment": trial.deployment,
        "values": dict(zip(trial.metric_names, trial.values or [], strict=False)),
        "output_throughput_tok_s": trial.throughput,
        "tpot_p99_ms": trial.tpot_p99_ms,
        "config": trial.config,
        "services": {
            name: {
                **rec.model_dump(exclude_none=True),
                "command": command_line(rec),
                "secrets": {s.var: s.what for s in split_service(rec).slots},
            }
            for name, rec in trial.services.items()
        },
        "start_order": start_order(trial.services),
        "metrics": trial.metrics,
        "server_metrics": trial.server_metrics,
        "engine_version": trial.engine_version,
        "effective": trial.effective,
        "overrides": trial.overrides,
    }
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"
