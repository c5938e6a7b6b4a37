"""The variables a trial's services inherited from autotune's environment, set by the export.

A local service ran with autotune's environment beneath its own settings; the trial records
the part its engine reads (``ServiceRecord.inherited_env``, :mod:`autotune.trial.inherited_env`).
systemd, compose and Kubernetes start a service with a clean environment, and a pasted
command runs in whatever shell it is pasted into, so every export except ``json`` (which
keeps the record as it is) folds them into the service's ``env``: the exported service runs
what was measured. The trial's own settings win over an inherited value, and a variable the
trial unsets stays unset.

A container does not have this machine's files: for ``compose`` and ``k8s`` an inherited
value that is a path (``LD_LIBRARY_PATH=/usr/local/cuda/lib64``, ``HF_HOME=/data/hf``) is left
out, and the notes say so.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from autotune.results import TrialResult

_PATHLIKE = re.compile(r"^(/|~|\./|\.\./)|:/")


def is_path(value: str) -> bool:
    """True for a file-system location (or a ``:``-separated list of them)."""
    return bool(_PATHLIKE.search(value))


def with_inherited_env(
    trial: TrialResult,
    *,
    containers: bool,
    notes: Callable[[str], None] | None,
) -> TrialResult:
    """``trial`` with each service's inherited variables folded under its ``env``."""
    services = {}
    carried: list[str] = []
    dropped: list[str] = []
    for name, rec in trial.services.items():
        inherited = {
            k: v
            for k, v in (rec.inherited_env or {}).items()
            if k not in rec.env and k not in rec.unset_env
        }
        if containers:
            dropped += [f"{name}: {k}={v}" for k, v in inherited.items() if is_path(v)]
            inherited = {k: v for k, v in inherited.items() if not is_path(v)}
        carried += [f"{name}: {k}={v}" for k, v in inherited.items()]
        if inherited:  # the stored command line lacks them: rebuilt from argv and env
            rec = rec.model_copy(update={"env": {**inherited, **rec.env}, "command": ""})
        services[name] = rec
    if notes is not None and carried:
        notes(
            f"{trial.title} ran with variables inherited from autotune's environment; the "
            "export sets them: " + ", ".join(carried)
        )
    if notes is not None and dropped:
        notes(
            f"{trial.title} also inherited paths of this machine, left out of the containers "
            "(set them for the image if it needs them): " + ", ".join(dropped)
        )
    return trial.model_copy(update={"services": services})
