"""The ``autotune`` command line.

Every command takes ``--study NAME`` and ``--storage URL``; the default storage is
``sqlite:///studies/NAME.db`` and the default study file ``studies/NAME.yaml``. Errors the
user can cause are printed as one line (file, field, allowed values) with exit code 2.

This module builds the app; each command lives with the others of its concern:

* ``_init``: init (a deployment, a space and a study from what runs today)
* ``_run``: run (the tuning loop)
* ``_results``: best, report, status
* ``_explain``: explain (what each of the winner's changes bought)
* ``_plan``: plan (replicas, GPUs, cost and energy of a fleet for a target rate)
* ``_storage``: migrate, dashboard
* ``_hosts``: restore, apply
* ``_bench``: bench
* ``_space``: space check, space render
* ``_common``: the shared options, consoles, error handling and help text
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import typer

from autotune.cli._bench import bench
from autotune.cli._common import help_text
from autotune.cli._explain import explain
from autotune.cli._hosts import apply, restore
from autotune.cli._init import init
from autotune.cli._plan import plan
from autotune.cli._results import best, report, status
from autotune.cli._run import run
from autotune.cli._space import space_check, space_render
from autotune.cli._storage import dashboard, migrate

__all__ = ["app", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Bayesian configuration search for LLM serving deployments.",
)
space_app = typer.Typer(no_args_is_help=True, help="Search-space files.")


def _command(group: typer.Typer, func: Callable[..., Any], name: str | None = None) -> None:
    """Register ``func`` with its docstring reflowed (see :func:`help_text`)."""
    group.command(name, help=help_text(func.__doc__))(func)


# Registered in the order `autotune --help` lists them.
_command(app, init)
_command(app, run)
_command(app, best)
_command(app, explain)
_command(app, plan)
_command(app, report)
_command(app, status)
_command(app, migrate)
_command(app, dashboard)
_command(app, restore)
_command(app, apply)
_command(app, bench)
_command(space_app, space_check, "check")
_command(space_app, space_render, "render")
app.add_typer(space_app, name="space")


def _quiet_libraries() -> None:
    """Optuna's INFO logs and experimental-API warnings are noise in a CLI."""
    import optuna  # here, not at the top: importing the app (tests, scripts) stays light

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def main() -> None:
    """The console script: ``autotune ...``."""
    _quiet_libraries()
    app()
