"""Damaged study files (``studies/*.yaml``) give a StudyDefinition or one clear ConfigError
naming the file, the field and the allowed values; never another exception.

A definition that loads is then taken as far as ``autotune run`` takes it before the first
trial: the space and deployment it points to, the sampler, the objective and the load the
tuner would apply (:meth:`Tuner._load_spec`), where again only a ConfigError may come out.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import optuna
import yaml
from fuzz_support import REPO, Case, Corpus, assert_clear, properties, write

from autotune.deployment import load_deployment
from autotune.engines import get_engine
from autotune.errors import ConfigError
from autotune.space import load_space
from autotune.study.definition import OBJECTIVES, SAMPLERS, StudyDefinition, load_study_definition
from autotune.study.objectives import Objective
from autotune.study.runner import Tuner
from autotune.study.samplers import make_sampler


def _absolute(path: Path) -> str:
    """The study file with ``space:``/``deployment:`` made absolute (it is copied to tmp)."""
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    for key in ("space", "deployment"):
        text = text.replace(f" {data[key]}", f" {(path.parent / data[key]).resolve()}", 1)
    tokenizer = (data.get("load") or {}).get("tokenizer")
    if tokenizer is not None:  # a model `make vllm-cpu` builds: any existing directory stands in
        built = (path.parent / tokenizer).resolve()
        text = text.replace(f" {tokenizer}", f" {built if built.exists() else REPO / 'tests'}", 1)
    return text


BASES = [*sorted((REPO / "studies").glob("*.yaml")), REPO / "tests" / "data" / "e2e-study.yaml"]
CORPUS = Corpus(BASES, StudyDefinition, texts=[_absolute(p) for p in BASES])
CLOSED = {"objective": OBJECTIVES, "sampler": SAMPLERS, "api": ("completions", "chat")}


def _exercise(definition: StudyDefinition, tmp: Path) -> None:
    """What the tuner builds from a definition before it launches anything."""
    space = load_space(definition.resolve(definition.space))
    deployment = load_deployment(definition.resolve(definition.deployment))
    objective = Objective(kind=definition.objective, slo=definition.slo)
    objective.constraint_keys  # noqa: B018 - computed from the SLOs
    make_sampler(
        definition.sampler,
        seed=definition.seed,
        grid=space.grid() if definition.sampler == "grid" else None,
        multi_objective=len(objective.directions) > 1,
    )
    engine = get_engine(space.model.engine.name, space.model.engine.version)
    fake = SimpleNamespace(definition=definition, deployment=deployment, engine=engine)
    Tuner._load_spec(fake)  # type: ignore[arg-type]


def check_study(case: Case) -> None:
    raw = CORPUS.render(case)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        path = write(tmp, "fuzzed-study.yaml", raw)
        try:
            definition = load_study_definition(path)
        except ConfigError as err:
            assert_clear(err, path, closed=CLOSED)
            return
        try:
            _exercise(definition, tmp)
        except ConfigError as err:
            text = str(err)
            assert "\n" not in text and "Traceback" not in text, text
            assert err.file or err.field, text


optuna.logging.set_verbosity(optuna.logging.WARNING)
test_study_files, test_study_files_soak = properties(CORPUS.cases(), check_study, examples=200)


def test_bases_are_the_bundled_studies() -> None:
    """The fuzz starts from every bundled study, each of which loads and resolves."""
    for path, text in zip(BASES, CORPUS.texts, strict=True):
        with tempfile.TemporaryDirectory() as name:
            copy = write(Path(name), path.name, text.encode())
            _exercise(load_study_definition(copy), Path(name))
