"""A fleet plan as data: one :class:`FleetRow` per configuration planned, the configurations
that cannot be planned and why, and the assumptions the arithmetic rests on.

The command line prints it as a table or dumps it as JSON (``--json``: these models'
``model_dump``), and the report draws it; all three read the same object, so they cannot
disagree.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autotune.plan.settings import PlanSettings


class FleetRow(BaseModel):
    """One configuration, sized for the target."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    """What it is: ``winner``, ``minimal winner``, ``baseline``, ``#3`` (its rank), or
    several of them joined (``winner, baseline`` when the baseline won)."""
    trial: int
    """The trial that measured it (the minimal winner: the trial it is the minimal form of)."""
    minimal: bool = False
    changes: int | None = None
    """Levers (derived ones included) set away from the baseline's values (``None`` without a
    baseline); an explanation counts changes, which group levers that go together."""
    deployment: str | None = None
    rate_mean: float
    """Requests/s one replica sustains under the SLOs: the mean over its measurements."""
    rate_lower: float
    """The lower 95% confidence bound of that rate (the mean itself while the study has no
    noise figure): what replicas are counted from."""
    measurements: int
    at_limit: bool = False
    """The capacity search passed its highest load: the rate is at least this."""
    replicas: int
    """``ceil(target x (1 + headroom) / rate_lower)``."""
    gpus_per_replica: int | None = None
    gpus: int | None = None
    rate_per_gpu: float | None = None
    """``rate_lower / gpus_per_replica``: what the report's plot puts on its x axis."""
    cost_per_hour: float | None = None
    output_tokens_per_request: float | None = None
    """Mean output tokens per request where the rate was measured (for the cost per token)."""
    cost_per_million_tokens: float | None = None
    """Cost per hour over the output tokens per hour the target rate asks for."""
    energy_per_token_j: float | None = None
    """J per output token of the GPUs over the measured phase, where NVML recorded it."""
    cheapest: bool = False
    """The cheapest planned configuration (by cost per hour, else GPUs, else replicas; ties
    to the higher rate's lower bound)."""
    notes: list[str] = Field(default_factory=list)


class Unplannable(BaseModel):
    """A measured configuration the plan leaves out, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    """``baseline``, or empty for another configuration."""
    trial: int
    reason: str


class FleetPlan(BaseModel):
    """What ``autotune plan`` prints (``--json``: this model) and the report draws."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    study: str
    settings: PlanSettings
    provisioned_rate: float
    """The target plus the headroom: what the replicas are sized for."""
    objective: str
    """The study's first objective as stored (``capacity_req_s``, ...)."""
    rate_source: str
    """Where each configuration's per-replica rate comes from, in words."""
    rows: list[FleetRow]
    unplannable: list[Unplannable] = Field(default_factory=list)
    """Configurations that cannot meet the SLOs at any rate measured (never planned)."""
    failed: dict[str, int] = Field(default_factory=dict)
    """Trials that did not run to a measurement, by failure class."""
    notes: list[str] = Field(default_factory=list)
    """What the plan assumes and what it lacks (a missing price, said once)."""

    @property
    def priced(self) -> bool:
        return self.settings.gpu_hour_cost is not None

    @property
    def cheapest(self) -> FleetRow | None:
        return next((r for r in self.rows if r.cheapest), None)
