"""Small spaces for the explanation tests (imported, not a conftest): written to a file and
loaded through :func:`autotune.space.load_space`, like every other space."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autotune.space import SearchSpace, load_space


def env_lever(name: str, **spec: Any) -> dict[str, Any]:
    """A lever that sets the environment variable ``NAME`` (no engine flag to check)."""
    return {**spec, "target": {"env": name.upper()}}


def make_space(
    tmp_path: Path,
    parameters: dict[str, dict[str, Any]],
    *,
    baseline: dict[str, Any] | None,
    forbidden: list[dict[str, Any]] | None = None,
    name: str = "explain-small",
) -> SearchSpace:
    data: dict[str, Any] = {
        "name": name,
        "services": ["server"],
        "engine": {"name": "generic"},
        "parameters": parameters,
    }
    if forbidden:
        data["forbidden"] = forbidden
    if baseline is not None:
        data["baseline"] = baseline
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_space(path)


def bool_levers(tmp_path: Path, names: list[str], **kwargs: Any) -> SearchSpace:
    """Independent bool levers, all false in the baseline."""
    return make_space(
        tmp_path,
        {n: env_lever(n, type="bool") for n in names},
        baseline={n: False for n in names},
        **kwargs,
    )
