"""Exporting a finished trial: systemd units, shell environment, command lines, JSON, a docker
compose file and Kubernetes manifests.

``export`` is what the CLI calls; the per-format functions are public for library use.

No export prints or copies a credential from the study (which holds ``<redacted>`` for
them; an older study's real values are redacted here first): ``env`` and ``command`` write
shell references (``"${HF_TOKEN:?...}"``, ``"${AUTOTUNE_SECRET_API_KEY:?...}"`` for a
secret flag's value), ``json`` keeps ``<redacted>`` and lists the variables under
``secrets``, and ``systemd`` puts the values into an owner-only ``EnvironmentFile=``, taken
from the current deployment (``current``) or the environment, else a placeholder that
``install.sh`` refuses (see :mod:`autotune.export.systemd`). ``compose`` references them
as required interpolations (``${HF_TOKEN:?...}``) and ``k8s`` as keys of a Secret the user
creates (``valueFrom.secretKeyRef``); both formats are described in their modules.

Every format but ``json`` also sets the variables the services inherited from autotune's
environment while they were measured (:mod:`autotune.export.inherited`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from autotune.errors import ConfigError
from autotune.export.compose import export_compose
from autotune.export.credentials import ServiceLike, redact_trial
from autotune.export.formats import export_command, export_env, export_json
from autotune.export.inherited import with_inherited_env
from autotune.export.k8s import export_k8s
from autotune.export.systemd import export_systemd
from autotune.results import TrialResult

Format = Literal["systemd", "env", "command", "json", "compose", "k8s"]
FORMATS: tuple[str, ...] = ("systemd", "env", "command", "json", "compose", "k8s")
CONTAINER_FORMATS: tuple[str, ...] = ("compose", "k8s")
"""The formats that run each service in a container (and take ``images``)."""
_SUFFIX = {
    "env": "env.sh",
    "command": "commands.sh",
    "json": "json",
    "compose": "compose.yaml",
    "k8s": "k8s.yaml",
}

__all__ = [
    "CONTAINER_FORMATS",
    "FORMATS",
    "Format",
    "export",
    "export_command",
    "export_compose",
    "export_env",
    "export_json",
    "export_k8s",
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
    study: str | None = None,
    images: Sequence[str] = (),
) -> list[Path] | str:
    """Export ``trial`` as ``fmt``.

    ``systemd`` needs ``out_dir`` and returns the written files. The text formats (``env``,
    ``command``, ``json``, ``compose``, ``k8s``) return the text when ``out_dir`` is None,
    else write ``trial-N.<suffix>`` there (``trial-7.k8s.yaml``) and return ``[path]``.
    ``current`` (service name -> rendered spec of the deployment as it is now) supplies the
    systemd export's secret values; ``notes`` receives what the user must still do (a
    secret left as a placeholder, a Secret to create, an image to give), by default printed
    to stderr. ``study`` names the study in the container formats' labels; ``images`` are
    their ``--image`` values (``IMAGE`` for every service, ``SERVICE=IMAGE``).
    """
    trial = redact_trial(trial)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format '{fmt}'", field="format", allowed=FORMATS)
    if fmt != "json":  # json keeps the record as stored, inherited_env apart
        trial = with_inherited_env(trial, containers=fmt in CONTAINER_FORMATS, notes=notes)
    if images and fmt not in CONTAINER_FORMATS:
        raise ConfigError(
            f"images are for the container formats, not {fmt}",
            field="images",
            allowed=CONTAINER_FORMATS,
        )
    if fmt == "systemd":
        if out_dir is None:
            raise ConfigError(
                "the systemd export writes several files and needs an output directory",
                field="out_dir",
            )
        return export_systemd(trial, out_dir=out_dir, current=current, notes=notes)
    if fmt == "compose":
        text = export_compose(trial, study=study, images=images, notes=notes)
    elif fmt == "k8s":
        text = export_k8s(trial, study=study, images=images, notes=notes)
    else:
        text = {"env": export_env, "command": export_command, "json": export_json}[fmt](trial)
    if out_dir is None:
        return text
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{trial.slug}.{_SUFFIX[fmt]}"
    path.write_text(text, encoding="utf-8")
    return [path]
