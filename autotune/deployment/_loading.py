"""Loading a deployment: a file path or a name found in ``launchers/``, with clear errors.

Parsed YAML becomes a checked :class:`~autotune.deployment._model.Deployment` (every problem
a :class:`~autotune.errors.ConfigError` naming the file and the field), and a name is looked
up in the working directory's ``launchers/`` first, then the bundled ones. Apart from the
models and their checks: this is the only part that touches the file system.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from autotune.deployment._checks import _check
from autotune.deployment._model import Deployment
from autotune.errors import ConfigError
from autotune.yamlio import one_line_errors, read_yaml, validation_error_to_config_error

BUNDLED_DIR = Path(__file__).resolve().parent.parent.parent / "launchers"


# --------------------------------------------------------------------- loading
def parse_deployment(data: object, *, file: str | Path) -> Deployment:
    """Validate parsed YAML; every problem is a ConfigError naming ``file``."""
    with one_line_errors():
        return _parse_deployment(data, file=file)


def _parse_deployment(data: object, *, file: str | Path) -> Deployment:
    label = str(file)
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping at the top level, got {type(data).__name__}", file=label
        )
    try:
        dep = Deployment.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, file=label, model=Deployment) from None
    dep._source = Path(file)
    _check(dep)
    return dep


def available_deployments(search_dirs: Sequence[Path] | None = None) -> dict[str, Path]:
    """Deployment name (file stem) -> file, first directory wins."""
    found: dict[str, Path] = {}
    for directory in search_dirs if search_dirs is not None else _default_dirs():
        if directory.is_dir():
            for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
                found.setdefault(path.stem, path)
    return found


def _default_dirs() -> list[Path]:
    return [Path.cwd() / "launchers", BUNDLED_DIR]


def load_deployment(
    path_or_name: str | Path, *, search_dirs: Sequence[Path] | None = None
) -> Deployment:
    """Load a deployment from a file path, or by name from ``launchers/`` (working directory
    first, then the bundled ones)."""
    path = Path(path_or_name).expanduser()
    if not path.is_file():
        known = available_deployments(search_dirs)
        if str(path_or_name) in known:
            path = known[str(path_or_name)]
        else:
            raise ConfigError(
                f"no deployment file or bundled deployment named '{path_or_name}'",
                field="deployment",
                allowed=sorted(known),
            )
    data = read_yaml(path)
    return parse_deployment(data, file=path)
