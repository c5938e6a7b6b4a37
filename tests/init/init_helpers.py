"""Helpers of the ``autotune init`` tests: the CLI in process, and the paths it writes.

pytest's default import mode puts only this directory on sys.path for these test modules;
the suite's shared helpers (``e2e_helpers``) sit one level up and the real-sshd lab
(``sshd_hosts``) in ``tests/remote``: both are added here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

TESTS = Path(__file__).resolve().parent.parent
for _path in (str(TESTS), str(TESTS / "remote")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from autotune.cli import app  # noqa: E402

REPO = TESTS.parent


class Init:
    """``autotune init`` run in process, writing under ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.runner = CliRunner()

    def __call__(self, *args: str, ok: bool = True, name: str = "imported") -> Any:
        result = self.runner.invoke(
            app, ["init", *args, "--out", str(self.out), "--name", name], catch_exceptions=False
        )
        if ok:
            assert result.exit_code == 0, result.output
        return result

    def files(self, name: str = "imported") -> tuple[Path, Path, Path]:
        return (
            self.out / "launchers" / f"{name}.yaml",
            self.out / "search_spaces" / f"{name}.yaml",
            self.out / "studies" / f"{name}.yaml",
        )

    def load(self, name: str = "imported") -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        dep, space, study = (yaml.safe_load(p.read_text()) for p in self.files(name))
        return dep, space, study
