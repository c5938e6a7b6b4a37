"""``autotune explain``'s errors, in-process (no servers): each is one line and exit code 2."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from e2e_helpers import E2E_STUDY
from typer.testing import CliRunner

from autotune.cli import app


@pytest.fixture()
def storage(tmp_path: Path) -> str:
    """A study database holding one (empty) study called ``other``, maximising."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    optuna.create_study(study_name="other", storage=url, direction="maximize")
    return url


def _explain(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["explain", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and "Traceback" not in output
    return lines[0]


def test_a_study_that_does_not_exist_is_one_line_and_not_created(storage: str) -> None:
    code, output = _explain("--study", "nope", "--storage", storage, "--study-file", str(E2E_STUDY))
    assert code == 2
    line = _one_error_line(output)
    assert "no study named 'nope'" in line and "other" in line
    assert optuna.get_all_study_names(storage) == ["other"]  # explain never creates one


def test_no_database_at_all_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'none.db'}"
    code, output = _explain("--study", "nope", "--storage", url, "--study-file", str(E2E_STUDY))
    assert code == 2 and "no study database" in _one_error_line(output)
    assert not (tmp_path / "none.db").exists()


def test_max_repeats_below_repeats_names_the_option(storage: str) -> None:
    code, output = _explain(
        "--study",
        "other",
        "--storage",
        storage,
        "--study-file",
        str(E2E_STUDY),
        "--repeats",
        "5",
        "--max-repeats",
        "2",
    )
    assert code == 2
    line = _one_error_line(output)
    assert "--max-repeats" in line
    assert "max_repeats (2) must be at least repeats (5)" in line
    assert "pydantic" not in line


def test_repeats_alone_raises_the_default_max_repeats(storage: str) -> None:
    # --repeats 8 above the default max_repeats (6) is not an error: max_repeats follows;
    # the study has no trial, so what fails is the explanation itself, after the settings
    code, output = _explain(
        "--study",
        "other",
        "--storage",
        storage,
        "--study-file",
        str(E2E_STUDY),
        "--repeats",
        "8",
        "--quiet",
    )
    assert code == 2
    line = _one_error_line(output)
    assert "max_repeats" not in line and "no feasible completed trial" in line


def test_show_before_any_explanation_says_how_to_make_one(storage: str) -> None:
    code, output = _explain("--study", "other", "--storage", storage, "--show")
    assert code == 2
    assert "no explanation yet: run `autotune explain --study other`" in _one_error_line(output)
