"""Study definitions (``studies/*.yaml``): which space, which deployment, how to score.

A study file ties one search space to one deployment, fixes the load (concurrency C, input
and output lengths) and states the objective and the SLO constraints. Paths inside it are
relative to the file itself, so a study directory can be moved as a whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from autotune.errors import ConfigError
from autotune.explain.settings import ExplainSettings
from autotune.loadgen.capacity import CapacitySearch, SweepSpec
from autotune.loadgen.spec import LoadSpec
from autotune.space.model import Scalar
from autotune.yamlio import load_model, one_line

SAMPLERS = ("tpe", "random", "grid", "qmc", "nsga2", "gp", "catcma", "rfbo")
"""``gp``, ``catcma`` and ``rfbo`` need an optional extra (autotune/study/extra_samplers.py)."""
OBJECTIVES = tuple(
    f"{primary}{suffix}"
    for primary in ("throughput", "capacity", "goodput", "energy")
    for suffix in ("", "_vs_tpot", "_vs_ttft")
)
"""What a study maximizes (output tok/s at the load, the highest load meeting the SLOs,
requests/s meeting them at the load's rate, or output tokens per kJ of GPU energy at the
load: the fewest J/token, which needs GPU telemetry), alone or against a p99 latency
(Pareto)."""
Objective = Literal[
    "throughput",
    "throughput_vs_tpot",
    "throughput_vs_ttft",
    "capacity",
    "capacity_vs_tpot",
    "capacity_vs_ttft",
    "goodput",
    "goodput_vs_tpot",
    "goodput_vs_ttft",
    "energy",
    "energy_vs_tpot",
    "energy_vs_ttft",
]
MAX_RACE_BUDGET = 500
"""Restarts one race may spend (a re-measurement's index stays below the journal's 1000)."""
MAX_SEED = 2**32 - 1
"""Optuna's samplers seed numpy, which takes 0 .. 2**32 - 1."""


def _path(value: Path) -> Path:
    text = str(value)
    if text in ("", ".") or any(ord(c) < 32 or c == "\x7f" for c in text):
        raise PydanticCustomError(
            "path", "expected the path of a file, got {value}", {"value": repr(text)}
        )
    return value


FilePath = Annotated[Path, AfterValidator(_path)]
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class SLOSettings(BaseModel):
    """Service-level objectives; each becomes an Optuna constraint (value > 0 = violated)."""

    model_config = ConfigDict(extra="forbid")

    ttft_p99_ms: PositiveFinite | None = None
    tpot_p99_ms: PositiveFinite | None = None
    e2e_p99_ms: PositiveFinite | None = None
    max_error_rate: float = Field(0.0, ge=0, le=1)


class CorrectnessSettings(BaseModel):
    """Greedy probe whose text must match the baseline's: a fast wrong answer is no answer."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    prompt: str = "Explain in one sentence why the sky is blue."
    max_tokens: int = Field(16, ge=1, le=4096)
    expected: str | None = None
    """Exact expected text; unset: the first healthy trial's text is the reference."""


class EarlyAbortSettings(BaseModel):
    """Stop measuring a trial that is clearly worse than the best one so far.

    During the measure phase (after ``load.min_duration_s``) the running throughput
    estimate's upper bound is compared with ``abort_below`` x the incumbent's throughput
    (the best feasible, fully measured trial); below it, the measure phase ends and the trial
    is stored with its partial estimate and ``aborted: reason``. The upper bound is the load
    generator's 95% confidence bound once it has one (about three request latencies into the
    measure phase: one of start-up ramp, then eight batches of a quarter latency each;
    ``autotune/loadgen/estimate.py``); before that, once every stream has finished a request,
    it is the running estimate x (1 + ``margin_before_ci``), and before even that, a bound
    from how long the first round's requests have been out (Little's law;
    ``autotune.study.abort.early_abort_reason``) x (1 + ``margin_before_ci``) (null: wait
    for the interval).
    Both cover only this run's noise: the gap to the incumbent (0.9 = 10%, 1/1.5 before an
    interval) is what protects a configuration as good as the incumbent from run-to-run
    noise (machine load, each process's own speed; ``benchmarks/winner_noise.py`` measures
    it).
    """

    model_config = ConfigDict(extra="forbid")

    abort_below: float = Field(0.9, gt=0, le=1)
    margin_before_ci: float | None = Field(0.5, ge=0, le=10, allow_inf_nan=False)


class RemeasureSettings(BaseModel):
    """Before a winner is declared, measure the best configurations again.

    When a run reaches its trial target, configurations are relaunched from fresh processes
    and measured again; ``autotune best`` then ranks by a lower 95% confidence bound over
    each configuration's measurements (``autotune/study/race.py`` has both policies):

    * ``policy: race`` (default): the configurations ``best`` chooses from race; each
      restart goes to the leader or to the closest configuration that could still beat it
      (by their ``confidence`` intervals, with the study's pooled run-to-run noise), until
      the leader is separated from every other one, or whatever overlaps is within
      ``indifference`` of it (either is fine), or ``budget`` restarts are spent. The budget
      is per trial target: resuming the same run continues the race; a run to a larger
      ``--trials`` races again, from everything stored, with a new budget. Unset, the
      budget is ``top_k x repeats`` (3 by default).
    * ``policy: fixed``: the ``top_k`` distinct feasible configurations (by their mean
      throughput) are each measured ``repeats`` more times.

    ``top_k: 0``, ``repeats: 0`` or ``budget: 0`` turns it off.
    """

    model_config = ConfigDict(extra="forbid")

    policy: Literal["race", "fixed"] = "race"
    top_k: int = Field(3, ge=0, le=100)
    repeats: int = Field(1, ge=0, le=20)
    budget: int | None = Field(None, ge=0, le=MAX_RACE_BUDGET)
    """Restarts the race may spend (re-measurements, failed ones included)."""
    confidence: float = Field(0.95, ge=0.5, le=0.999, allow_inf_nan=False)
    """Two-sided level of the intervals the race separates (``best`` reports 95%)."""
    indifference: float = Field(0.01, ge=0, le=0.5, allow_inf_nan=False)
    """A configuration that can beat the leader by at most this fraction (0.01 = 1%) at
    ``confidence`` is not raced further."""

    @model_validator(mode="after")
    def _fields_of_the_policy(self) -> RemeasureSettings:
        given = self.model_fields_set
        if self.policy == "fixed":
            for name in ("budget", "confidence", "indifference"):
                if name in given:
                    raise PydanticCustomError(
                        "remeasure_policy",
                        "{name} is a setting of policy: race; policy: fixed measures the "
                        "top_k configurations repeats more times each",
                        {"name": name, "field": name},
                    )
        elif "budget" in given:
            for name in ("top_k", "repeats"):
                if name in given:
                    raise PydanticCustomError(
                        "remeasure_policy",
                        "{name} only sizes the race's default budget (top_k x repeats) and "
                        "budget is set: drop {name}, or set policy: fixed to measure the "
                        "top_k configurations repeats more times each",
                        {"name": name, "field": name},
                    )
        return self

    @property
    def race_budget(self) -> int:
        """Restarts the race may spend per trial target."""
        if self.budget is not None:
            return self.budget
        return min(self.top_k * self.repeats, MAX_RACE_BUDGET)

    @property
    def enabled(self) -> bool:
        if self.policy == "fixed":
            return self.top_k > 0 and self.repeats > 0
        return self.race_budget > 0


class WorkerSettings(BaseModel):
    """How workers sharing a study watch each other (``autotune run`` on several machines).

    Each worker beats every ``heartbeat_s`` for its running trial; a trial whose heartbeat
    is older than ``lease_s`` is failed as ``worker_lost`` by any live worker and its config
    re-queued. The lease must cover a database outage you want to ride out without losing
    trials, and several heartbeats.
    """

    model_config = ConfigDict(extra="forbid")

    heartbeat_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    lease_s: float = Field(60.0, gt=0, le=86400, allow_inf_nan=False)

    @model_validator(mode="after")
    def _lease_covers_beats(self) -> WorkerSettings:
        if self.lease_s < 2 * self.heartbeat_s:
            raise PydanticCustomError(
                "lease",
                "lease_s ({lease}) must be at least twice heartbeat_s ({beat})",
                {"lease": f"{self.lease_s:g}", "beat": f"{self.heartbeat_s:g}", "field": "lease_s"},
            )
        return self


class WarmStartSettings(BaseModel):
    """Start a new study from an earlier one (``autotune run --warm-start-from STUDY``).

    Before its first trial, the new study enqueues the earlier study's ``top`` best distinct
    feasible configurations (ranked as ``autotune best`` ranks them) and carries its failed
    launches as infeasible trials the sampler learns from, both translated to this study's
    space (``autotune/study/warm_start.py``). Once only: resuming never repeats it.
    ``storage``: where the earlier study is (a URL as ``--storage`` takes; default: the
    ``--storage`` of the run, else the earlier study's own default
    ``sqlite:///studies/STUDY.db``).
    """

    model_config = ConfigDict(extra="forbid")

    study: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
    storage: str | None = Field(None, min_length=1)
    top: int = Field(5, ge=0, le=100)


class StudyDefinition(BaseModel):
    """One ``studies/NAME.yaml`` file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
    description: str = ""
    space: FilePath
    deployment: FilePath
    objective: Objective = "throughput"
    capacity: CapacitySearch | None = None
    """How a ``capacity`` objective searches (defaults when left out): over the request
    rate or the concurrency, from where, how precisely, within what time."""
    curve: SweepSpec | None = None
    """A latency-throughput curve every trial records after its measurement (``report``
    draws the top configurations'); a capacity search records its probes anyway."""
    sampler: Literal["tpe", "random", "grid", "qmc", "nsga2", "gp", "catcma", "rfbo"] = "tpe"
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    """Seeds the sampler: trial N's draws depend on the seed, N and the finished trials only,
    so the study proposes the same configurations run in one go or resumed
    (:mod:`autotune.study._trial_seed`). ``None``: fresh entropy in every process."""
    load: LoadSpec = Field(default_factory=LoadSpec)  # type: ignore[arg-type]
    """The load each trial is scored at (DOMAIN.md §3): the load generator's own spec. What
    it leaves unsaid (prompt form, ``ignore_eos``, ``[DONE]``) the engine's request quirks
    decide; the served model comes from the deployment, the SLOs from ``slo:``."""
    slo: SLOSettings = Field(default_factory=SLOSettings)  # type: ignore[arg-type]
    correctness: CorrectnessSettings = Field(default_factory=CorrectnessSettings)  # type: ignore[arg-type]
    early_abort: EarlyAbortSettings | None = None
    """Null (default): every trial is measured in full."""
    remeasure: RemeasureSettings = Field(default_factory=RemeasureSettings)  # type: ignore[arg-type]
    workers: WorkerSettings = Field(default_factory=WorkerSettings)  # type: ignore[arg-type]
    explain: ExplainSettings = Field(default_factory=ExplainSettings)  # type: ignore[arg-type]
    """``autotune explain``'s measuring (``enabled``: also at the end of ``autotune run``)."""
    trial_timeout_s: PositiveFinite = 1800.0
    keep_services_running: bool = False
    enqueue: list[dict[str, Scalar]] = Field(default_factory=list)
    """Configurations tried right after the baseline of a new study, each written as the
    baseline's changes (``{chunked_prefill: false, max_num_batched_tokens: 512}``): settings
    a colleague swears by, or one suspected to fail. Checked against the space on load."""

    warm_start: WarmStartSettings | None = None
    """Null (default): a new study starts from its baseline and ``enqueue:`` only."""

    source: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _measurement_fits_the_objective(self) -> StudyDefinition:
        primary = self.objective.split("_vs_")[0]
        load, slo = self.load, self.slo
        latency_slo = any(v is not None for v in (slo.ttft_p99_ms, slo.tpot_p99_ms, slo.e2e_p99_ms))

        def error(field: str, message: str) -> PydanticCustomError:
            return PydanticCustomError("objective", message, {"field": field})

        if self.capacity is not None and primary != "capacity":
            raise error(
                "capacity",
                f"capacity: configures a capacity search, but the objective is "
                f"{self.objective!r} (use capacity, capacity_vs_tpot or capacity_vs_ttft)",
            )
        search = self.capacity or CapacitySearch()
        if primary == "capacity":
            if not latency_slo:
                raise error(
                    "slo",
                    "a capacity objective needs a latency SLO to hold: set slo.ttft_p99_ms, "
                    "slo.tpot_p99_ms or slo.e2e_p99_ms",
                )
            if "max_error_rate" in search.model_fields_set:
                raise error("capacity.max_error_rate", "the error-rate limit is slo.max_error_rate")
            if search.over == "rate" and load.request_rate is not None:
                raise error(
                    "load.request_rate",
                    "the capacity search sets the request rate: leave load.request_rate out "
                    "(capacity.start is where the search begins)",
                )
        if self.early_abort is not None and primary != "throughput":
            raise error(
                "early_abort",
                "early_abort compares a trial's live output throughput with the best so far: "
                f"it applies to a throughput objective, not {self.objective!r}",
            )
        if primary == "goodput":
            if load.request_rate is None:
                raise error(
                    "load.request_rate",
                    "a goodput objective counts the requests meeting the SLOs at a given "
                    "rate: set load.request_rate (req/s)",
                )
            if not latency_slo:
                raise error("slo", "a goodput objective needs a latency SLO (slo.ttft_p99_ms, ...)")
        open_loop = load.request_rate is not None or (
            primary == "capacity" and search.over == "rate"
        )
        if not open_loop:
            for name in ("burstiness", "max_concurrency"):
                if name in load.given:
                    raise error(
                        f"load.{name}",
                        f"load.{name} shapes an open loop: set load.request_rate too (or "
                        f"search capacity over the rate); a closed loop runs load.concurrency "
                        f"streams",
                    )
        return self

    def measure_plan(self) -> tuple[CapacitySearch | None, SweepSpec | None]:
        """The capacity search (its error limit the study's) and the curve each trial runs."""
        if not self.objective.startswith("capacity"):
            return None, self.curve
        search = (self.capacity or CapacitySearch()).model_copy(
            update={"max_error_rate": self.slo.max_error_rate}
        )
        return search, self.curve

    @model_validator(mode="after")
    def _load_leaves_model_and_slo_to_others(self) -> StudyDefinition:
        for key, where in (
            ("slo", "the study's slo: section (p99 limits, max_error_rate)"),
            ("model", "the deployment's model: field"),
        ):
            if key in self.load.given:
                raise PydanticCustomError(
                    "load_field",
                    "load.{key} is set by {where}",
                    {"key": key, "where": where, "field": f"load.{key}"},
                )
        return self

    def resolve(self, relative: Path) -> Path:
        """A path from the file, made absolute against the file's directory."""
        if relative.is_absolute() or self.source is None:
            return relative
        return (self.source.parent / relative).resolve()


def load_study_definition(path: Path) -> StudyDefinition:
    """Load and validate a study file; errors name the file and the field."""
    definition = load_model(path, StudyDefinition)
    definition.source = path.resolve()
    files: list[tuple[str, Path, bool]] = [
        ("space", definition.space, True),
        ("deployment", definition.deployment, True),
    ]
    dataset = definition.load.dataset
    if dataset is not None and dataset.kind == "sharegpt":
        files.append(("load.dataset.path", dataset.path, True))
    if definition.load.tokenizer is not None:
        files.append(("load.tokenizer", Path(definition.load.tokenizer), False))
    for field, relative, must_be_file in files:
        target = definition.resolve(relative)
        if not (target.is_file() if must_be_file else target.exists()):
            # Named here, with the study file, rather than later as a file of its own.
            raise one_line(
                ConfigError(
                    f"no such file {str(target)!r} (a relative path is relative to the study file)",
                    file=str(path),
                    field=field,
                )
            )
    return definition
