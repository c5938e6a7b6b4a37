"""What an explanation stores in the study, typed.

Three kinds of study user attributes (never trials: trial counts, the sampler, reuse and
the race never see them):

* ``explain:run:KEY:I``: measurement ``I`` of the configuration whose
  :meth:`~autotune.space.SearchSpace.config_key` is ``KEY``, from freshly started services
  (:class:`ExplainRun`). A measurement is of a configuration, not of one explanation: a
  later explanation (another winner) reuses it.
* ``explain:state``: the decisions taken so far (:class:`ExplainState`): the order of the
  changes once the ablation has ranked them, and each step of the elimination. Frozen when
  taken, so a resumed explanation continues the same path even though more measurements
  change the pooled noise.
* ``explain:result``: the last :class:`Explanation` computed (what ``report`` draws and
  ``best --minimal`` exports).
"""

from __future__ import annotations

from typing import Any, Literal

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import StorageError
from autotune.telemetry import Telemetry
from autotune.trial.record import ConfigValue, ServiceRecord

RUN_PREFIX = "explain:run:"
STATE_ATTR = "explain:state"
RESULT_ATTR = "explain:result"
EXPLANATION_SCHEMA = 1


def run_key(key: str, index: int) -> str:
    return f"{RUN_PREFIX}{key}:{index}"


class ExplainRun(BaseModel):
    """One measurement of one configuration (study attribute ``explain:run:KEY:I``)."""

    model_config = ConfigDict(extra="ignore")

    key: str
    index: int
    config: dict[str, ConfigValue | None] = Field(default_factory=dict)
    values: list[float] = Field(default_factory=list)
    feasible: bool = False
    """Every SLO held (a run that broke one is still a measurement of the throughput)."""
    failure: str | None = None
    reason: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    services: dict[str, ServiceRecord] = Field(default_factory=dict)
    engine_version: dict[str, str] = Field(default_factory=dict)
    overrides: list[str] = Field(default_factory=list)
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    capacity: dict[str, Any] | None = None
    """A capacity search's result (its bracket is the value's resolution)."""
    telemetry: Telemetry | None = None
    """The GPUs over the run's measured phase (power, J/token), when they were measured."""
    source: str | None = None
    """Where a borrowed run was measured (``STUDY#N``: that study's trial N, ``STUDY#N/R``:
    its re-measurement R; :mod:`autotune.explain.borrowed`); None: by this explanation."""
    measured_at: float | None = None
    """Unix time when this explanation stored the run (None: borrowed, or stored before
    runs were timed): which machine an explanation resumed on last
    (:func:`autotune.explain.occasions.by_occasion`)."""

    @property
    def machine(self) -> str | None:
        """The GPUs the run was measured on (their NVML UUIDs), None where none were
        measured (a CPU machine, the twin)."""
        return None if self.telemetry is None else self.telemetry.machine

    @property
    def value(self) -> float | None:
        """The first objective's value; None when the run failed (nothing was measured)."""
        if self.failure is not None or not self.values:
            return None
        return float(self.values[0])


class Decision(BaseModel):
    """One step of the minimal-winner search: a change dropped or kept, and why."""

    model_config = ConfigDict(extra="ignore")

    change: str
    action: Literal["dropped", "kept"]
    why: str
    key: str | None = None
    """The configuration tried without it (None: it could not be built)."""


class ExplainState(BaseModel):
    """The decisions an explanation has taken (study attribute ``explain:state``)."""

    model_config = ConfigDict(extra="ignore")

    winner: int
    """The trial explained: a new winner starts a new state (measurements are kept)."""
    winner_key: str
    order: list[str] | None = None
    """The changes by measured contribution, largest first (set when the ablation is done)."""
    decisions: list[Decision] = Field(default_factory=list)
    together: list[str] | None = None
    """The negligible changes the elimination first tries to drop together (frozen when the
    minimal search starts; ``[]``: none tried; :mod:`autotune.explain.elimination`)."""
    together_dropped: bool | None = None
    """That attempt's outcome (None until decided)."""
    runs: int = 0
    """Measurements this explanation has taken (its budget counts them)."""
    left_out: list[str] = Field(default_factory=list)
    """Studies whose lent runs read apart from the explanation's own (the drift between
    occasions, :mod:`autotune.explain.occasions`): no longer read, their configurations
    measured here."""


class Interval(BaseModel):
    """A mean (or a difference) with its 95% interval; no bounds without a noise figure."""

    model_config = ConfigDict(extra="forbid")

    value: float
    low: float | None = None
    high: float | None = None


class Measured(BaseModel):
    """A configuration's measurements in an explanation."""

    model_config = ConfigDict(extra="forbid")

    key: str | None
    n: int = 0
    values: list[float] = Field(default_factory=list)
    mean: Interval | None = None
    failure: str | None = None
    """Why it did not run (the first failed run's class and reason)."""
    infeasible: int = 0
    """Runs that broke an SLO."""


class Effect(BaseModel):
    """What one change bought: the winner against the winner without it."""

    model_config = ConfigDict(extra="forbid")

    change: str
    levers: list[str]
    winner: dict[str, ConfigValue | None]
    baseline: dict[str, ConfigValue | None]
    reverted: list[str]
    """The changes reverted to measure it (itself, or with a partner when alone is refused)."""
    note: str | None = None
    """How a conditional or forbidden revert was handled, in words."""
    without: Measured
    contribution: Interval | None = None
    """Winner minus winner-without-it (the objective's unit); None when it could not run."""
    relative: float | None = None
    """Contribution over the winner's mean."""
    required: bool = False
    """Without it the deployment failed or broke an SLO: it cannot be dropped."""


class PathStep(BaseModel):
    """One step from the baseline to the winner, changes added largest first."""

    model_config = ConfigDict(extra="forbid")

    added: list[str]
    """The changes added at this step (more than one when the smaller step is refused)."""
    measured: Measured
    step: Interval | None = None
    """This step's mean minus the previous step's."""
    note: str | None = None


class Minimal(BaseModel):
    """The smallest set of changes measured within the tolerance of the winner."""

    model_config = ConfigDict(extra="forbid")

    kept: list[str]
    dropped: list[str]
    config: dict[str, ConfigValue | None]
    measured: Measured
    ratio: Interval | None = None
    """Its mean over the winner's, with the 95% interval of the ratio."""
    decisions: list[Decision]
    complete: bool
    """Every change was tried (False: the budget ran out first)."""


class Occasion(BaseModel):
    """How the runs one study lent read against the explanation's own
    (:mod:`autotune.explain.occasions`)."""

    model_config = ConfigDict(extra="forbid")

    study: str
    configurations: int = 0
    """Configurations holding runs of both kinds (0: nothing to compare)."""
    ratio: Interval | None = None
    """Lent over own (geometric mean over those configurations), with its 95% interval."""
    left_out: bool = False
    """The planner no longer reads its runs: they read apart (:attr:`ExplainState.left_out`)."""

    @property
    def drift(self) -> bool:
        """The interval excludes 1: the occasions differ."""
        r = self.ratio
        return (
            r is not None and r.low is not None and r.high is not None and (r.low > 1 or r.high < 1)
        )


class Explanation(BaseModel):
    """Everything ``autotune explain`` found (study attribute ``explain:result``)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = EXPLANATION_SCHEMA
    winner: int
    unit: str
    objective: str
    tolerance: float
    confidence: float = 0.95
    winner_config: dict[str, ConfigValue | None]
    baseline_config: dict[str, ConfigValue | None]
    winner_measured: Measured
    baseline_measured: Measured
    noise_sd: float | None = None
    noise_df: int = 0
    effects: list[Effect] = Field(default_factory=list)
    path: list[PathStep] = Field(default_factory=list)
    minimal: Minimal | None = None
    runs: int = 0
    """Runs this explanation measured (its budget counts them)."""
    borrowed: int = 0
    """Runs of its configurations borrowed from other studies (``--runs-from``) and from the
    study's own trials (``--own-runs``)."""
    borrowed_own: int = 0
    """Of ``borrowed``, those from the explained study's own trials."""
    occasions: list[Occasion] = Field(default_factory=list)
    """Per study lending runs, how they read against the explanation's own."""
    complete: bool = False
    stopped: str | None = None
    """Why the explanation stopped before the end (the budget), None when complete."""


def _attrs(study: optuna.Study) -> dict[str, Any]:
    return study.user_attrs


def load_runs(study: optuna.Study) -> dict[str, list[ExplainRun]]:
    """Config key -> its explanation measurements in index order."""
    out: dict[str, list[ExplainRun]] = {}
    for name, raw in _attrs(study).items():
        if not name.startswith(RUN_PREFIX) or not isinstance(raw, dict):
            continue
        try:
            run = ExplainRun.model_validate(raw)
        except ValidationError as exc:
            raise StorageError(f"study attribute {name}: not an explanation run: {exc}") from exc
        out.setdefault(run.key, []).append(run)
    for runs in out.values():
        runs.sort(key=lambda r: r.index)
    return out


def load_state(study: optuna.Study) -> ExplainState | None:
    raw = _attrs(study).get(STATE_ATTR)
    if raw is None:
        return None
    try:
        return ExplainState.model_validate(raw)
    except ValidationError as exc:
        raise StorageError(f"study attribute {STATE_ATTR}: {exc}") from exc


def load_explanation(study: optuna.Study) -> Explanation | None:
    """The stored explanation; None before ``autotune explain`` ran (or from a newer
    release whose schema this one does not read)."""
    raw = _attrs(study).get(RESULT_ATTR)
    if not isinstance(raw, dict) or raw.get("schema_version") != EXPLANATION_SCHEMA:
        return None
    try:
        return Explanation.model_validate(raw)
    except ValidationError as exc:
        raise StorageError(f"study attribute {RESULT_ATTR}: {exc}") from exc
