"""Declarative search spaces: YAML files of parameters, targets, constraints and a baseline.

Public API::

    space = load_space("search_spaces/dsv4-flash-rtx6000-pd.yaml")
    study.enqueue_trial(space.baseline_params())
    config = space.suggest(trial)              # active + derived parameters
    space.violations(config)                   # [Violation(name, reason)]
    space.settings_for("decode", config)       # ServiceSettings: flags, env, removals
    check_space(path)                          # SpaceSummary for `autotune space check`

The file format is documented by :mod:`autotune.space.model` and the JSON schema in
``autotune/schemas/search_space.schema.json``.
"""

from __future__ import annotations

from autotune.space.loader import load_space, parse_space
from autotune.space.model import Value
from autotune.space.searchspace import SearchSpace, TrialConfig, Violation
from autotune.space.settings import ServiceSettings
from autotune.space.summary import SpaceSummary, check_space

__all__ = [
    "SearchSpace",
    "ServiceSettings",
    "SpaceSummary",
    "TrialConfig",
    "Value",
    "Violation",
    "check_space",
    "load_space",
    "parse_space",
]
