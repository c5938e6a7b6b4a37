"""Study definitions (``studies/*.yaml``): which space, which deployment, how to score.

A study file ties one search space to one deployment, fixes the load (concurrency C, input
and output lengths) and states the objective and the SLO constraints. Paths inside it are
relative to the file itself, so a study directory can be moved as a whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autotune.yamlio import load_model

SAMPLERS = ("tpe", "random", "grid", "qmc", "nsga2")
OBJECTIVES = ("throughput", "throughput_vs_tpot")


class LoadSettings(BaseModel):
    """The fixed load each trial is scored at (DOMAIN.md §3)."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(16, ge=1, le=4096)
    input_len: int = Field(256, ge=1)
    output_len: int = Field(32, ge=1)
    warmup_requests: int | None = Field(None, ge=0)
    requests: int | None = Field(64, ge=1)
    duration_s: float | None = Field(None, gt=0)
    max_duration_s: float = Field(120.0, gt=0)
    request_timeout_s: float = Field(60.0, gt=0)
    api: Literal["completions", "chat"] = "completions"

    @model_validator(mode="after")
    def _one_stop_rule(self) -> LoadSettings:
        if self.duration_s is not None:
            self.requests = None
        return self


class SLOSettings(BaseModel):
    """Service-level objectives; each becomes an Optuna constraint (value > 0 = violated)."""

    model_config = ConfigDict(extra="forbid")

    ttft_p99_ms: float | None = Field(None, gt=0)
    tpot_p99_ms: float | None = Field(None, gt=0)
    e2e_p99_ms: float | None = Field(None, gt=0)
    max_error_rate: float = Field(0.0, ge=0, le=1)


class CorrectnessSettings(BaseModel):
    """Greedy probe whose text must match the baseline's: a fast wrong answer is no answer."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    prompt: str = "Explain in one sentence why the sky is blue."
    max_tokens: int = Field(16, ge=1, le=4096)
    expected: str | None = None
    """Exact expected text; unset: the first healthy trial's text is the reference."""


class StudyDefinition(BaseModel):
    """One ``studies/NAME.yaml`` file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
    description: str = ""
    space: Path
    deployment: Path
    objective: Literal["throughput", "throughput_vs_tpot"] = "throughput"
    sampler: Literal["tpe", "random", "grid", "qmc", "nsga2"] = "tpe"
    seed: int | None = None
    load: LoadSettings = Field(default_factory=LoadSettings)  # type: ignore[arg-type]
    slo: SLOSettings = Field(default_factory=SLOSettings)  # type: ignore[arg-type]
    correctness: CorrectnessSettings = Field(default_factory=CorrectnessSettings)  # type: ignore[arg-type]
    trial_timeout_s: float = Field(1800.0, gt=0)
    keep_services_running: bool = False

    source: Path | None = Field(None, exclude=True)

    def resolve(self, relative: Path) -> Path:
        """A path from the file, made absolute against the file's directory."""
        if relative.is_absolute() or self.source is None:
            return relative
        return (self.source.parent / relative).resolve()


def load_study_definition(path: Path) -> StudyDefinition:
    """Load and validate a study file; errors name the file and the field."""
    definition = load_model(path, StudyDefinition)
    definition.source = path.resolve()
    return definition
