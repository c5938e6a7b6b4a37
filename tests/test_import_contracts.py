"""The import contracts of pyproject.toml (``[tool.importlinter]``) hold, and break when a
layer imports upwards: a broken contract fails the suite, not only ``make lint``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        found = shutil.which("lint-imports")
        if found is None:
            pytest.fail("lint-imports is not installed (the dev extra has import-linter)")
        exe = Path(found)
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(exe), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_contracts_are_kept() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_upward_import_breaks_a_contract(tmp_path: Path) -> None:
    """Control: a deployment model importing the launcher is reported."""
    shutil.copytree(
        ROOT / "autotune", tmp_path / "autotune", ignore=shutil.ignore_patterns("*.pyc")
    )
    model = tmp_path / "autotune" / "deployment" / "_model.py"
    model.write_text(model.read_text() + "\nimport autotune.launch.managed  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "Configuration models load no launcher BROKEN" in done.stdout
    assert "Layers point down BROKEN" in done.stdout
