"""Fleet planning: how many replicas of which configuration serve a target request rate, on
how many GPUs, at what cost and energy (``autotune plan``; the report draws the last plan).

* :mod:`~autotune.plan.settings`: :class:`PlanSettings` (target, headroom, price, a stated
  per-replica rate), checked once, stored on the study for the report;
* :mod:`~autotune.plan.fleet`: :func:`make_plan`, the plan from the study's measurements;
* :mod:`~autotune.plan.rates`: each configuration's per-replica rate (a capacity, or a stated
  rate) and :func:`replicas_needed` from its lower 95% bound;
* :mod:`~autotune.plan.excluded`: what is never planned, and why;
* :mod:`~autotune.plan.model`: :class:`FleetPlan` and its rows, what the table, ``--json``
  and the report read;
* :mod:`~autotune.plan.gpus`: :func:`deployment_gpus`, a deployment's ``gpus:`` by name.
"""

from __future__ import annotations

from autotune.plan.fleet import make_plan
from autotune.plan.gpus import deployment_gpus
from autotune.plan.model import FleetPlan, FleetRow, Unplannable
from autotune.plan.rates import rate_kind, replicas_needed
from autotune.plan.settings import (
    SETTINGS_ATTR,
    PlanSettings,
    load_settings,
    parse_headroom,
    store_settings,
)

__all__ = [
    "SETTINGS_ATTR",
    "FleetPlan",
    "FleetRow",
    "PlanSettings",
    "Unplannable",
    "deployment_gpus",
    "load_settings",
    "make_plan",
    "parse_headroom",
    "rate_kind",
    "replicas_needed",
    "store_settings",
]
