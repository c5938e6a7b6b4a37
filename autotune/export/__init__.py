"""Exporting a finished trial: systemd units, shell environment, command lines, JSON.

``export`` is what the CLI calls; the per-format functions are public for library use.

No export prints or copies a credential from the study (which holds ``<redacted>`` for
them; an older study's real values are redacted here first): ``env`` and ``command`` write
shell references (``"${HF_TOKEN:?...}"``, ``"${AUTOTUNE_SECRET_API_KEY:?...}"`` for a
secret flag's value), ``json`` keeps ``<redacted>`` and lists the variables under
``secrets``, and ``systemd`` puts the values into an owner-only ``EnvironmentFile=``, taken
from the current deployment (``current``) or the environment, else a placeholder that
``install.sh`` refuses (see :mod:`autotune.export.systemd`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from autotune.errors import ConfigError
from autotune.export.credentials import ServiceLike, redact_trial
from autotune.export.formats import export_command, export_env, export_json
from autotune.export.systemd import export_systemd
from autotune.results import TrialResult

Format = Literal["systemd", "env", "command", "json"]
FORMATS: tuple[str, ...] = ("systemd", "env", "command", "json")
_SUFFIX = {"env": "env.sh", "command": "commands.sh", "json": "json"}

__all__ = [
    "FORMATS",
    "Format",
    "export",
    "export_command",
    "export_env",
    "export_json",
    "export_systemd",
    "redact_trial",
]


def _note_to_stderr(text: str) -> None:
    sys.stderr.write(f"note: {text}\n")


def export(
    trial: TrialResult,
    *,
    fmt: Format,
    out_dir: Path | None,
    current: Mapping[str, ServiceLike] | None = None,
    notes: Callable[[str], None] | None = _note_to_stderr,
) -> list[Path] | str:
    """Export ``trial`` as ``fmt``.

    ``systemd`` needs ``out_dir`` and returns the written files. The text formats return the
    text when ``out_dir`` is None, else write ``trial-N.<suffix>`` there and return ``[path]``.
    ``current`` (service name -> rendered spec of the deployment as it is now) supplies the
    systemd export's secret values; ``notes`` receives what the user must still do (a
    secret left as a placeholder), by default printed to stderr.
    """
    trial = redact_trial(trial)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format '{fmt}'", field="format", allowed=FORMATS)
    if fmt == "systemd":
        if out_dir is None:
            raise ConfigError(
                "the systemd export writes several files and needs an output directory",
                field="out_dir",
            )
        return export_systemd(trial, out_dir=out_dir, current=current, notes=notes)
    text = {"env": export_env, "command": export_command, "json": export_json}[fmt](trial)
    if out_dir is None:
        return text
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{trial.slug}.{_SUFFIX[fmt]}"
    path.write_text(text, encoding="utf-8")
    return [path]
