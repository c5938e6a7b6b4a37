"""What the compose and Kubernetes export tests share: trials of every bundled deployment,
the validators, and test oracles written from the formats' own rules (not from the code).

A bundled deployment's trial is built the way the pipeline stores one: its services rendered
for a configuration of its space (``render`` -> ``service_records``), written into a real
Optuna study with the shared factory (tests/conftest_results.py) and read back as a
``TrialResult``. Each deployment gets its baseline and a random configuration of its space.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from conftest_results import TrialSpec, make_study
from jsonschema import Draft7Validator

from autotune.deployment import load_deployment
from autotune.render import render
from autotune.results import TrialResult, load_results
from autotune.space import load_space
from autotune.trial.pipeline import service_records

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "launchers"
K8S_VERSION = "1.33.0"
"""The Kubernetes release whose OpenAPI schemas the manifests are checked against."""
COMPOSE_SCHEMA = REPO / "tests" / "data" / "compose-spec" / "compose-spec.json"
SPACE_OF_UNSTUDIED = {
    # Bundled deployments no bundled study names: the space of their kind.
    "dsv4-flash-pd-local": "dsv4-flash-rtx6000-pd",
    "dsv4-flash-pd-ssh": "dsv4-flash-rtx6000-pd",
    "sim-dsv4-flash-pd-ssh": "dsv4-flash-rtx6000-pd",
}
LISTEN_FLAGS = ("--host", "--prometheus-host")
LOCAL = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def bundled_deployments() -> list[str]:
    return sorted(p.stem for p in LAUNCHERS.glob("*.yaml"))


@cache
def _spaces() -> dict[str, Path]:
    """Deployment name -> the space a bundled study tunes it with."""
    out: dict[str, Path] = {}
    for study in sorted((REPO / "studies").glob("*.yaml")):
        data = yaml.safe_load(study.read_text())
        deployment = Path(str(data.get("deployment", ""))).stem
        if deployment and "space" in data:
            out.setdefault(deployment, (study.parent / str(data["space"])).resolve())
    for name, space in SPACE_OF_UNSTUDIED.items():
        out.setdefault(name, REPO / "search_spaces" / f"{space}.yaml")
    return out


def bundled_trial(tmp_path: Path, deployment: str, *, seed: int | None = None) -> TrialResult:
    """A stored trial of the bundled ``deployment``: its baseline (``seed`` None) or a random
    configuration of its space, with ``engine_version`` as its servers would report it."""
    space_file = _spaces().get(deployment)
    assert space_file is not None, f"no space for bundled deployment {deployment}: add one above"
    space = load_space(space_file)
    dep = load_deployment(LAUNCHERS / f"{deployment}.yaml")
    config = (
        space.baseline_config()
        if seed is None
        else space.complete(space.random_config(random.Random(seed)))
    )
    specs = render(space, dep, config, run_dir=tmp_path / "run")
    records = {n: r.model_dump() for n, r in service_records(specs).items()}
    study = make_study(
        tmp_path / "db",
        [TrialSpec(services=records, attrs={"deployment": f"{deployment}.yaml"})],
    )
    return load_results(study)[0]


def cases() -> list[tuple[str, int | None]]:
    return [(d, seed) for d in bundled_deployments() for seed in (None, 7)]


# --------------------------------------------------------------------- validators
def validate_k8s(doc: dict[str, Any]) -> None:
    """The official OpenAPI schema of ``doc``'s kind at :data:`K8S_VERSION`, strict (an unknown
    field fails); raises ``kubernetes_validate.ValidationError``."""
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@cache
def _compose_validator() -> Draft7Validator:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def compose_errors(doc: dict[str, Any]) -> list[str]:
    """Every violation of the compose specification's schema, as ``path: message``."""
    return [
        "/".join(map(str, e.absolute_path)) + ": " + e.message
        for e in _compose_validator().iter_errors(doc)
    ]


# Kubernetes' API-server rules that the OpenAPI schemas do not carry (apimachinery
# validation): names, label values, port names.
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
IANA_SVC = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


def api_server_problems(doc: dict[str, Any]) -> list[str]:
    meta = doc["metadata"]
    problems = []
    if not (DNS1035.fullmatch(meta["name"]) and len(meta["name"]) <= 63):
        problems.append(f"name {meta['name']!r} is not a DNS-1035 label")
    for key, value in meta.get("labels", {}).items():
        if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
            problems.append(f"label {key}={value!r} is not a label value")
    ports = [p["name"] for p in doc["spec"].get("ports", [])]
    for container in doc["spec"].get("template", {}).get("spec", {}).get("containers", []):
        ports += [p["name"] for p in container.get("ports", [])]
    for name in ports:
        ok = IANA_SVC.fullmatch(name) and len(name) <= 15 and re.search("[a-z]", name)
        if not ok or "--" in name:
            problems.append(f"port name {name!r} is not an IANA service name")
    return problems


# --------------------------------------------------------------------- oracles
def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command, args and env values
    (third_party/forked/golang/expansion): ``$$`` is ``$``, ``$(NAME)`` the variable (left as
    it is when unknown), any other ``$`` itself."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def compose_unescape(text: str) -> str:
    """Compose's interpolation of a text without variables: ``$$`` is a literal ``$``."""
    return text.replace("$$", "$")


def assert_container_argv(
    original: Sequence[str], exported: Sequence[str], hostnames: dict[str, str]
) -> None:
    """``exported`` is ``original`` word for word, but for the three documented rewrites: the
    tuner's interpreter -> python3, a listen address -> 0.0.0.0, a URL naming another
    service's host:port -> its hostname with the same port."""
    assert len(exported) == len(original), (original, exported)
    for i, (was, now) in enumerate(zip(original, exported, strict=True)):
        if was == now:
            continue
        if was.startswith("/") and re.fullmatch(r"python[0-9.]*", was.rsplit("/", 1)[-1]):
            assert now == "python3", (i, was, now)
        elif i > 0 and original[i - 1] in LISTEN_FLAGS:
            assert now == "0.0.0.0", (i, was, now)
        else:
            pattern = re.compile(r"(\w+)://([^/:\s]+):(\d+)")
            rebuilt = pattern.sub(
                lambda m: (
                    f"{m.group(1)}://HOST:{m.group(3)}"
                    if m.group(2) in LOCAL or m.group(2) in hostnames.values() or "." in m.group(2)
                    else m.group(0)
                ),
                was,
            )
            assert pattern.sub(lambda m: f"{m.group(1)}://HOST:{m.group(3)}", now) == rebuilt
            assert any(f"://{h}:" in now for h in hostnames.values()), (i, was, now)
