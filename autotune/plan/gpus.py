"""How many GPUs a trial's deployment occupies: ``gpus:`` of the deployment file of that
name, read when the plan or the report is made.

A trial records its deployment's name, not its GPU count (the count is informational: nothing
is placed by it), so a plan and the report's figures per GPU look the file up by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from autotune.deployment import available_deployments, load_deployment
from autotune.errors import AutotuneError


def deployment_gpus(
    names: Iterable[str], *, search_dirs: Sequence[Path] | None = None
) -> dict[str, tuple[int, str]]:
    """``name -> (GPUs, file)`` for the named deployments whose file sets ``gpus:``.

    Among the files :func:`autotune.deployment.available_deployments` finds (``launchers/``
    in the working directory first, then the bundled ones; or ``search_dirs``), a file
    matches by its ``name:``, its stem or its file name. Names without such a file, or
    whose file does not load or sets no ``gpus:``, are left out."""
    wanted = {n for n in names if n}
    found: dict[str, tuple[int, str]] = {}
    if not wanted:
        return found
    for stem, path in available_deployments(search_dirs).items():
        try:
            dep = load_deployment(path)
        except AutotuneError:
            continue
        if dep.gpus is None:
            continue
        for key in {dep.name, stem, path.name} & wanted:
            found.setdefault(key, (dep.gpus, shown_path(path)))
        if wanted <= set(found):
            break
    return found


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory, else its name (no home directory in a
    plan or a report that is meant to be shared)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name
