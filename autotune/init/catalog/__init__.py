"""The levers known to matter for each engine: a curated, cited catalog (``catalog/*.yaml``).

One file per engine (``vllm.yaml``, ``sglang.yaml``, ``sglang-router.yaml``,
``transformers-serve.yaml``) plus ``common.yaml`` for what any engine's process reads (NCCL,
PyTorch's allocator). Each lever says where its value goes (a flag or a variable), what it
offers beside the value a deployment runs today, where it applies (CPU or GPU, several GPUs,
the service's role in a prefill/decode deployment, model families), and the engine source or
document that says it matters (``cite``): the description every proposed parameter carries.

Which release a lever exists in is not written here: the engine's manifest of the imported
release decides (:func:`applies`), so a flag a release renamed or removed is never proposed,
and a candidate value its parser refuses is dropped. The ``recipes`` are the engines'
published settings for a model family (vLLM's recipes, SGLang's model pages), each with the
page it comes from; :mod:`autotune.init.proposal` enqueues them as a trial.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.engines import FLAG_PATTERN
from autotune.errors import ConfigError
from autotune.init.model import ImportedService
from autotune.space.model import Scalar
from autotune.yamlio import load_model

CATALOG_PACKAGE = "autotune.init.catalog"
COMMON = "common"
Role = Literal["server", "prefill", "decode", "router"]
Requirement = Literal["multi_gpu", "multi_worker"]
Platform = Literal["cpu", "gpu"]
_PLATFORMS: tuple[Platform, ...] = ("cpu", "gpu")
_ROLES: tuple[Role, ...] = ("server", "prefill", "decode")


class MapChoice(BaseModel):
    """What one choice of a ``map`` lever sets (flags with values and switches)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flags: dict[str, Scalar] = Field(default_factory=dict)
    switches: list[str] = Field(default_factory=list)


class Lever(BaseModel):
    """One lever: where it goes, what to offer, where it applies, why (with its source)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    kind: Literal["int", "float", "choice", "bool", "env", "map"]
    """int/float/choice: a flag with a value; bool: a switch (``--enforce-eager``) or an
    on/off pair (``--enable-x``/``--no-enable-x``), as the manifest declares it; env: a
    variable; map: a choice among whole sets of flags (a speculative-decoding setting)."""
    flag: str | None = Field(default=None, pattern=FLAG_PATTERN)
    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    candidates: list[Scalar] = Field(default_factory=list)
    """Values offered beside today's (and beside the engine's default when it is unset)."""
    choices: dict[str, MapChoice] = Field(default_factory=dict)
    """``map`` levers: choice name -> what it sets (``off: {}`` sets nothing)."""
    min: float | None = None
    max: float | None = None
    factor: float = Field(default=4.0, gt=1)
    """int: today's value is explored from value/factor to value*factor (log scale)."""
    spread: float = Field(default=0.05, gt=0)
    """float: today's value +- spread, on a 0.01 grid."""
    platforms: list[Platform] = Field(default_factory=lambda: list(_PLATFORMS))
    roles: list[Role] = Field(default_factory=lambda: list(_ROLES))
    requires: list[Requirement] = Field(default_factory=list)
    models: str | None = None
    """A regular expression the model's path or name must match (case-insensitive)."""
    engines: list[str] | None = None
    """``common.yaml`` only: the engines it applies to (default: every one)."""
    default: Scalar | None = None
    """The engine's own value when the lever is unset (for ``explain``)."""
    why: str
    cite: str

    @field_validator("models")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)
        return value

    @model_validator(mode="after")
    def _target(self) -> Lever:
        if (self.kind == "env") != (self.env is not None):
            raise ValueError(f"lever {self.name}: kind env needs env:, other kinds flag:")
        if self.kind not in ("env", "map") and self.flag is None:
            raise ValueError(f"lever {self.name}: kind {self.kind} needs flag:")
        if self.kind == "map" and not self.choices:
            raise ValueError(f"lever {self.name}: kind map needs choices:")
        return self

    def owned_flags(self) -> list[str]:
        if self.kind == "map":
            out: list[str] = []
            for choice in self.choices.values():
                out += [f for f in [*choice.flags, *choice.switches] if f not in out]
            return out
        return [self.flag] if self.flag else []


class Recipe(BaseModel):
    """An engine's published setting for a model family."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    models: str
    set: dict[str, Scalar] = Field(min_length=1)
    """Lever -> value (a map lever's choice name, a bool lever's true/false)."""
    says: str
    cite: str


class Catalog(BaseModel):
    """One engine's catalog file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str
    sources: str = ""
    levers: list[Lever] = Field(default_factory=list)
    recipes: list[Recipe] = Field(default_factory=list)


@functools.cache
def load_catalog(engine: str) -> Catalog:
    """The catalog of ``engine`` (empty when there is none: the generic engine)."""
    entry = resources.files(CATALOG_PACKAGE).joinpath(f"{engine}.yaml")
    if not entry.is_file():
        return Catalog(engine=engine)
    with resources.as_file(entry) as path:
        catalog = load_model(path, Catalog)
    if catalog.engine != engine:
        raise ConfigError(f"catalog {engine}.yaml names engine {catalog.engine}")
    return catalog


def levers_for(engine: str) -> list[Lever]:
    """The engine's own levers, then the common ones that apply to it."""
    common = [
        lever
        for lever in load_catalog(COMMON).levers
        if lever.engines is None or engine in lever.engines
    ]
    return [*load_catalog(engine).levers, *common]


def multi_gpu(service: ImportedService) -> bool:
    """Several GPUs in one service (tensor parallel, or several visible devices)."""
    for flag in ("--tp-size", "--tensor-parallel-size"):
        option = service.option(flag)
        if option is not None and isinstance(option.value, int) and option.value > 1:
            return True
    count = service.gpu_count
    return count is not None and count > 1


def workers(service: ImportedService) -> int:
    """The most workers of one kind a router sends to (``--prefill``, ``--decode``,
    ``--worker-urls``): a routing policy only chooses among several."""
    counts = {"--prefill": 0, "--decode": 0, "--worker-urls": 0}
    for option in service.options:
        if option.flag in ("--prefill", "--decode"):
            counts[option.flag] += 1
        elif option.flag == "--worker-urls":
            counts[option.flag] += len(option.values)
    return max(counts.values())


def applies(lever: Lever, service: ImportedService) -> str | None:
    """Why ``lever`` is not proposed for ``service`` (``None``: it is)."""
    if service.platform not in lever.platforms:
        return f"not on {service.platform}"
    if service.role not in lever.roles:
        return f"not for a {service.role}"
    if "multi_gpu" in lever.requires and not multi_gpu(service):
        return "needs several GPUs"
    if "multi_worker" in lever.requires and workers(service) < 2:
        return "needs several workers of a kind"
    if lever.models is not None and not re.search(
        lever.models, service.model_path() or "", re.IGNORECASE
    ):
        return "not for this model"
    manifest = service.engine.manifest
    if manifest is None:
        return None if lever.kind == "env" else "no parser to check the flag against"
    for flag in lever.owned_flags():
        if manifest.option(flag) is None:
            return f"{flag} does not exist in {service.engine.name} {service.engine.version}"
    if (
        lever.env is not None
        and lever.env.startswith(service.engine.env_prefixes)
        and manifest.env_names is not None
        and lever.env not in manifest.env_names
    ):
        return f"{lever.env} is not read by {service.engine.name} {service.engine.version}"
    return None


def allowed_candidates(lever: Lever, service: ImportedService) -> list[Scalar]:
    """The lever's candidates that this release's parser accepts (choices and type)."""
    manifest = service.engine.manifest
    option = manifest.option(lever.flag) if manifest is not None and lever.flag else None
    if option is None:
        return list(lever.candidates)
    out: list[Scalar] = []
    for value in lever.candidates:
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if service.engine.check_values(lever.flag or "", [text]) is None:
            out.append(value)
    return out
