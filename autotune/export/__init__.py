"""Exporting a finished trial: systemd units, shell environment, command lines, JSON.

``export`` is what the CLI calls; the per-format functions are public for library use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from autotune.errors import ConfigError
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
]


def export(trial: TrialResult, *, fmt: Format, out_dir: Path | None) -> list[Path] | str:
    """Export ``trial`` as ``fmt``.

    ``systemd`` needs ``out_dir`` and returns the written files. The text formats return the
    text when ``out_dir`` is None, else write ``trial-N.<suffix>`` there and return ``[path]``.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format '{fmt}'", field="format", allowed=FORMATS)
    if fmt == "systemd":
        if out_dir is None:
            raise ConfigError(
                "the systemd export writes several files and needs an output directory",
                field="out_dir",
            )
        return export_systemd(trial, out_dir=out_dir)
    text = {"env": export_env, "command": export_command, "json": export_json}[fmt](trial)
    if out_dir is None:
        return text
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"trial-{trial.number}.{_SUFFIX[fmt]}"
    path.write_text(text, encoding="utf-8")
    return [path]
