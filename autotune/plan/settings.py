"""What a fleet plan is asked for (:class:`PlanSettings`), read from the command line, and
stored on the study so that ``autotune report`` draws the plan last asked for.

Every figure the user gives is checked here, once, with the option it came from named in
the error (``--target-rate``, ``--headroom``, ...): the arithmetic in
:mod:`autotune.plan.fleet` then never meets a zero or negative rate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import ConfigError, StorageError

SETTINGS_ATTR = "plan:settings"
"""Study user attribute: the :class:`PlanSettings` of the last ``autotune plan``."""

OPTIONS = {
    "target_rate": "--target-rate",
    "headroom": "--headroom",
    "gpu_hour_cost": "--gpu-hour-cost",
    "per_replica_rate": "--per-replica-rate",
    "gpus_per_replica": "--gpus-per-replica",
    "top": "--top",
}
"""Each setting's command-line option: errors name what the user typed."""


class PlanSettings(BaseModel):
    """A fleet plan's inputs. Rates in requests/s of the study's load shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_rate: float = Field(gt=0, allow_inf_nan=False)
    """The peak request rate the fleet must serve (req/s)."""
    headroom: float = Field(default=0.2, ge=0, le=10, allow_inf_nan=False)
    """Provisioned beyond the target, as a fraction (0.2: 20% more), for bursts, a replica
    lost or rolled, and the distance between a benchmark and production traffic."""
    gpu_hour_cost: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The price of one GPU for one hour; without it the cost columns are omitted."""
    per_replica_rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """For a study that measured no capacity (throughput, goodput, energy): the request rate
    one replica of the winner sustains under the SLOs, known from elsewhere."""
    gpus_per_replica: int | None = Field(default=None, ge=1, le=100_000)
    """Overrides the deployment file's ``gpus:`` (one replica = one deployment)."""
    top: int = Field(default=5, ge=1, le=50)
    """The best this many distinct configurations are planned (the winner first), with the
    minimal winner and the baseline."""

    @property
    def provisioned_rate(self) -> float:
        """The rate the fleet is sized for: the target plus the headroom."""
        return self.target_rate * (1.0 + self.headroom)

    @classmethod
    def from_options(cls, **values: Any) -> PlanSettings:
        """The settings from command-line values; a bad one is a :class:`ConfigError` that
        names its option and the accepted range."""
        try:
            return cls.model_validate({k: v for k, v in values.items() if v is not None})
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else ""
            option = OPTIONS.get(name, name)
            got = values.get(name)
            raise ConfigError(f"{err['msg'].lower()}; got {got!r}", field=option or None) from None


def parse_headroom(text: str | None) -> float | None:
    """``20%`` or ``0.2`` -> 0.2. A bare number above 1 is refused (``20`` would be 2000%
    headroom, not the 20% meant), as is anything negative or not a number."""
    if text is None:
        return None
    raw = text.strip()
    percent = raw.endswith("%")
    number = raw[:-1].strip() if percent else raw
    if not re.fullmatch(r"[0-9]*\.?[0-9]+(e[+-]?[0-9]+)?", number, flags=re.I):
        raise ConfigError(
            f"not a fraction or a percentage: {text!r}", field="--headroom", allowed=["0.2", "20%"]
        )
    value = float(number) / (100.0 if percent else 1.0)
    if not math.isfinite(value):
        raise ConfigError(f"not a finite number: {text!r}", field="--headroom")
    if not percent and value > 1.0:
        raise ConfigError(
            f"{text} would be {value * 100:g}% headroom; write {value:g}% for that, or a "
            "fraction between 0 and 1",
            field="--headroom",
            allowed=["0.2", "20%"],
        )
    return value


def store_settings(study: optuna.Study, settings: PlanSettings) -> None:
    """Remember the plan on the study: the report draws the last one asked for."""
    study.set_user_attr(SETTINGS_ATTR, settings.model_dump(mode="json"))


def load_settings(study: optuna.Study) -> PlanSettings | None:
    """The last stored plan's settings; ``None`` when ``autotune plan`` never ran on it."""
    raw = study.user_attrs.get(SETTINGS_ATTR)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise StorageError(f"study attribute {SETTINGS_ATTR}: not a mapping: {raw!r}")
    try:
        return PlanSettings.model_validate(raw)
    except ValidationError as exc:
        raise StorageError(f"study attribute {SETTINGS_ATTR}: {exc}") from exc
