"""Every bundled search space, damaged: a SearchSpace or one clear ConfigError naming the
file, the field and the allowed values; never another exception.

``tests/space/test_space_fuzz.py`` mutates the DeepSeek space and a small one structurally;
this adds the other bundled spaces, YAML syntax damage, whole-file garbage and the step
after loading that puts choice values into command lines: rendering trial configurations
against a deployment (the values must come out verbatim or as a ConfigError).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import optuna
import pytest
from fuzz_support import REPO, Case, Corpus, assert_clear, properties, write

from autotune.deployment import Deployment, load_deployment
from autotune.errors import ConfigError
from autotune.render import render
from autotune.space import SearchSpace, check_space, load_space
from autotune.space.model import PARAM_TYPES, TARGET_KINDS, SpaceFile

CORPUS = Corpus(sorted((REPO / "search_spaces").glob("*.yaml")), SpaceFile)
CLOSED = {"type": PARAM_TYPES, "target": TARGET_KINDS}
SIM = load_deployment(REPO / "launchers" / "sim-dsv4-flash-pd.yaml")
TRANSFORMERS = load_deployment(REPO / "launchers" / "transformers-serve-local.yaml")
VLLM = Deployment.model_validate(
    {
        "name": "vllm",
        "endpoint": "http://${server.host}:${server.port}",
        "services": {"server": {"command": ["vllm", "serve", "--port", "${port}"], "port": 8000}},
    }
)


def _exercise(space: SearchSpace, tmp: Path) -> None:
    """Use a loaded space the way a study does, up to the rendered command lines."""
    rng = random.Random(1)
    deployment = next(
        (d for d in (SIM, TRANSFORMERS) if set(space.services) <= set(d.services)), VLLM
    )
    configs = [space.random_config(rng) for _ in range(3)]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    configs.append(space.complete(space.suggest(study.ask())))
    if space.has_baseline:
        space.baseline_params()
        configs.append(space.baseline_config())
    for config in configs:
        space.violations(config)
        space.config_key(config)
        specs = render(space, deployment, config, run_dir=tmp / "run")
        for spec in specs.values():
            spec.command_line()
    space.grid()


def check_space_file(case: Case) -> None:
    raw = CORPUS.render(case)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for sibling in CORPUS.files:  # what a space `extends` lies beside it
            write(tmp, sibling.name, sibling.read_bytes())
        path = write(tmp, "fuzzed-space.yaml", raw)
        try:
            space = load_space(path)
        except ConfigError as err:
            # A broken file that the fuzzed one `extends` is named itself (the documented
            # rule, tests/space/test_space_extends.py), and must be just as clear.
            named = Path(err.file) if err.file and err.file != str(path) else path
            assert named == path or named.name in str(raw), str(err)
            assert_clear(err, named, closed=CLOSED)
            return
        str(check_space(path))
        try:
            _exercise(space, tmp)
        except ConfigError as err:
            text = str(err)
            assert "\n" not in text and "Traceback" not in text, text


optuna.logging.set_verbosity(optuna.logging.WARNING)
test_space_files, test_space_files_soak = properties(CORPUS.cases(), check_space_file, examples=150)


def test_bases_are_the_bundled_spaces() -> None:
    """The fuzz starts from every bundled space, each of which renders cleanly."""
    assert len(CORPUS.files) >= 2
    with tempfile.TemporaryDirectory() as name:
        for path in CORPUS.files:
            _exercise(load_space(path), Path(name))


def test_a_baseline_key_named_like_a_closed_field_is_a_parameter_name(tmp_path: Path) -> None:
    """Found by this fuzzer in a clean-clone run (2026-12-06): a fuzzed space whose baseline
    names a parameter `target`. The product's error lists the space's parameters, as it
    should; the checker had taken the key for a parameter's `target:` field and wanted its
    kinds. Written out, so the case holds whatever line numbers the corpus has."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "name: s\nservices: [decode]\nparameters:\n  x: {type: bool, target: {env: AUTOTUNE_X}}\n"
        "baseline:\n  target: true\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_space(space)
    err = caught.value
    assert err.field == "baseline.target" and err.message.startswith("unknown parameter 'target'")
    assert err.allowed == ["x"]
    assert_clear(err, space, closed=CLOSED)
