"""One error tree: every exception a user can meet is an AutotuneError, drawn in the module
docstring of ``autotune.errors``, and printed by the CLI as one line with exit code 2."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

import autotune.errors
from autotune.cli._common import friendly
from autotune.errors import AutotuneError
from autotune.launch.order import DependencyError, dependency_order
from autotune.remote.shell import ShellError
from autotune.remote.ssh import HostKeyError
from autotune.space.params import DomainError
from autotune.study.runner import HostFailure
from autotune.study.workers import WorkerBusy

DEFINED_ELSEWHERE = [
    ShellError,
    HostKeyError,
    HostFailure,
    WorkerBusy,
    DependencyError,
    DomainError,
]


def _subclasses(cls: type) -> list[type]:
    subs: list[type] = cls.__subclasses__()
    return [c for sub in subs for c in (sub, *_subclasses(sub))]


@pytest.mark.parametrize("cls", DEFINED_ELSEWHERE, ids=lambda c: c.__name__)
def test_public_exceptions_are_autotune_errors(cls: type) -> None:
    assert issubclass(cls, AutotuneError)


def test_the_docstring_draws_every_public_class() -> None:
    doc = autotune.errors.__doc__ or ""
    public = [c for c in _subclasses(AutotuneError) if not c.__name__.startswith("_")]
    assert set(DEFINED_ELSEWHERE) <= set(public)
    for cls in [AutotuneError, *public]:
        assert f" {cls.__name__} " in doc, f"{cls.__name__} is missing from the tree"


def test_dependency_error_keeps_its_fields() -> None:
    with pytest.raises(AutotuneError) as info:
        dependency_order({"a": ["zz"]})
    assert isinstance(info.value, DependencyError)
    assert (info.value.service, info.value.unknown) == ("a", "zz")


@pytest.mark.parametrize(
    "error",
    [
        ShellError("gpu1", "cannot connect to root@gpu1:22: connection refused"),
        WorkerBusy("worker 'w' is already running (pid 7 on host h)"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_cli_prints_them_as_one_line(error: AutotuneError) -> None:
    """They used to end a command in a traceback (exit code 1)."""
    demo = typer.Typer()

    @friendly
    def fail() -> None:
        raise error

    demo.command()(fail)
    result = CliRunner().invoke(demo, [])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert result.output.strip() == f"error: {error}"
    assert "Traceback" not in result.output
