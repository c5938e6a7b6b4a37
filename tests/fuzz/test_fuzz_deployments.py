"""Damaged deployment files (``launchers/*.yaml``) give a Deployment or one clear
ConfigError naming the file, the field and the allowed values; never another exception.

A file that loads is then used the way ``autotune run`` uses it (ports, run directory,
rendering with and without the bundled space, the endpoint, the paste-able command line),
where again only a ConfigError may come out.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from fuzz_support import REPO, Case, Corpus, assert_clear, properties, write

from autotune.deployment import Deployment, load_deployment
from autotune.errors import ConfigError
from autotune.render import render
from autotune.space import load_space

CORPUS = Corpus(sorted((REPO / "launchers").glob("*.yaml")), Deployment)
SPACE = load_space(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
CLOSED = {
    "manager": ("local", "process", "systemd"),
    "sudo": ("auto", "always", "never"),
    "depends_on": (),
    "on": (),
}
"""Fields with a closed set of values: an error about one lists (a subset of) them; () for
sets the file defines (services, hosts)."""


def _exercise(dep: Deployment, tmp: Path) -> None:
    """What ``autotune run`` does with a deployment before any process starts."""
    run_dir = tmp / "run"
    dep.ports()
    dep.default_run_dir("study")
    for space in (None, SPACE):
        config = SPACE.baseline_config() if space is not None else {}
        specs = render(space, dep, config, run_dir=run_dir)
        for spec in specs.values():
            spec.command_line()
            spec.fingerprint()
        dep.endpoint_url(specs, run_dir=run_dir)


def check_deployment(case: Case) -> None:
    raw = CORPUS.render(case)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        path = write(tmp, "fuzzed-deployment.yaml", raw)
        try:
            dep = load_deployment(path)
        except ConfigError as err:
            assert_clear(err, path, closed=CLOSED)
            return
        try:
            _exercise(dep, tmp)
        except ConfigError as err:
            text = str(err)
            assert "\n" not in text and "Traceback" not in text, text
            assert err.field, text


test_deployment_files, test_deployment_files_soak = properties(
    CORPUS.cases(), check_deployment, examples=200
)


def test_bases_are_the_bundled_deployments() -> None:
    """The fuzz starts from every bundled deployment, each of which loads."""
    assert len(CORPUS.files) >= 4
    for path in CORPUS.files:
        assert load_deployment(path).services
